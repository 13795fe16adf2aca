"""The priority index: one key per pending task, ``q/{queue}/{inv}/{due}/{task}``, one range
per priority level, and ``v/{queue}/{inv}`` listing the levels with each one's floor (see
docs/etcd.md, "reading a level"). Here: entering and leaving the index, listing a queue's
levels, reading a level from its floor within a learned window, and raising floors past the
tasks a claim took."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from contend.domain.limits import FAIR_KEYS
from contend.store.etcd.keys import Keys, enc, is_fair_level, prefix_end, unenc
from contend.store.etcd.record import Record, index_value
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import RAISE, Op, delete, enter, put, raise_floor

#: How many read windows (one per priority level) an instance keeps.
WINDOW_CACHE = 4096
#: The most priority levels whose floor one claim transaction raises.
RISE_OPS = 8

_ID_BITS = 112  # task ids are 28 hex digits: 112 bits


def enter_pending(keys: Keys, rec: Record) -> list[Op]:
    """Put a pending *rec* in the index: its key, and its level's floor at most it (a
    central task: its key in the central index, which has no levels to list)."""
    rec.indexed = True
    if rec.central:
        return [put(keys.central(rec), index_value(rec))]
    level, spot = keys.level(rec), keys.spot(rec)
    return [
        put(keys.k("q", level, spot), index_value(rec)),
        enter(keys.k("v", level), spot.encode()),
    ]


def leave_pending(keys: Keys, rec: Record) -> list[Op]:
    """Take a pending *rec* out of the index (its new state is set by the caller)."""
    if not rec.indexed:
        return []
    rec.indexed = False
    return [delete(keys.pending(rec))]


def any_kv(kv: Any) -> bool:
    return True


@dataclass(slots=True)
class Window:
    """Where the next read of one index level may stop: *span* positions (``position``) past
    the further of where it starts and *last*, the last key the previous read reached (so the
    keys that read saw and left are in the window, whatever lies between batches). *span* is
    adapted so that a window holds a page or a few: doubled when a read ran past the bound,
    halved when it held many pages."""

    last: bytes  # the whole key, prefix included
    span: int

    def segments(self, prefix: bytes, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """The ranges to read in turn: from *start* up to the bound, then on to *end*."""
        base = max(start, self.last)[len(prefix) :]
        due, tid = divmod(position(base) + self.span, 1 << _ID_BITS)
        bound = prefix + f"{due:017d}/{tid:028x}".encode()
        if due >= 10**17 or not start < bound < end:
            return [(start, end)]
        return [(start, bound), (bound, end)]

    @staticmethod
    def after(
        window: Window | None,
        skip: int,
        start: bytes,
        last: bytes,
        spilled: bool,
        count: int,
        page: int,
        full: bool,
    ) -> Window | None:
        """The window for the next read, from how this one went: it read from *start* up to
        *last*; *spilled*: it had to read past the bound; *count*: the keys its first range
        held; *full*: it found all it wanted."""
        if not last or not full:
            return None  # the whole index was read and held too few: no bound needed
        width = max(1, position(last[skip:]) - position(start[skip:]))
        if window is None:
            return Window(last, 2 * width)  # keys lie unevenly: ids cluster by millisecond
        span = window.span
        if spilled:
            span = max(4 * span, width)
        elif count > 4 * page:
            span = max(1, span // 2)
        return Window(last, span)


def position(spot: bytes) -> int:
    """A place within a priority level as a number: ``{due}/{id}`` -> due << 112 | id, the id
    read as hex where it is 28 hex digits (contend's own ids) and as 0 otherwise."""
    try:
        due = int(spot[:17])
    except ValueError:
        return 0
    tid = spot[18:46]
    try:
        num = int(tid, 16) if len(tid) == 28 else 0
    except ValueError:
        num = 0
    return (due << _ID_BITS) | num


@dataclass(slots=True)
class LevelRead:
    """One read of a priority level's tasks by a claim: what it needs to raise the floor."""

    prefix: bytes  # the level's task keys: q/{queue}/{inv}/
    level: bytes  # the level key: v/{queue}/{inv}
    start: bytes  # the floor the read began at (a spot within the level)
    revision: int  # the lowest revision its ranges were read at
    keys: list[bytes]  # every task key it went through, in order, from *start* on
    floor: bytes = b""  # the floor v/ listed
    listed_at: int = 0  # the level key's mod_revision when v/ listed it (0: not listed)

    def rise(self, taken: set[str]) -> Op | None:
        """The operation that raises the floor past the keys *taken* (claimed in the same
        transaction) that head this read, or None. Sound because the raise happens only if
        the level key is as v/ listed it, at or before this read: no task has entered since
        (every entry puts the key), so every task at or above the floor was read."""
        if not self.listed_at or self.listed_at > self.revision or self.floor < self.start:
            return None
        skip = len(self.prefix)
        for key in self.keys:
            tid = key[skip + 18 :].decode()
            if (unenc(tid) if "%" in tid else tid) not in taken:
                top = key[skip:]  # the first task left
                break
        else:
            if not self.keys:
                return None
            top = self.keys[-1][skip:] + b"\0"  # just past the last read, every one taken
        return raise_floor(self.level, self.listed_at, top) if top > self.floor else None


class Levels:
    """The priority levels of this store as this instance reads them: the floors v/ listed
    last time (``known``, read from meanwhile) and a read window per level."""

    def __init__(self, etcd: Etcd, keys: Keys) -> None:
        self._etcd = etcd
        self.keys = keys
        self.windows: dict[bytes, Window | None] = {}  # a level's tasks' prefix -> read bound
        self.known: dict[str, dict[str, bytes]] = {}  # queue -> {level: floor}, as listed
        self._levels_base = len(keys.k("v", ""))
        self.fair_turns: dict[str, int] = {}  # queue -> where its next window of fair levels starts

    @property
    def etcd(self) -> Etcd:
        return self._etcd

    async def read(
        self,
        prefix: bytes,
        start: bytes,
        page: int,
        want: int,
        keep: Callable[[Any], bool],
        window_of: bytes = b"",
        due_by: int | None = None,
    ) -> tuple[list[Any], LevelRead]:
        """The KeyValues of a priority level's tasks (keys under *prefix*, from *start*) that
        *keep* accepts, in key order: at least *want* where there are that many, from at least
        a *page* of keys; and what the read went through.

        etcd counts every key of a range it reads, whatever the limit, so a read to the end of
        a level costs time in proportion to its backlog (about 50 ms at 100,000 tasks). Each
        level's read therefore stops at a bound a little past the further of *start* and
        where the last read ended (its ``Window``); only when fewer keys lie before the bound
        does it read on to the end.
        *window_of* keeps the windows of reads of different sizes apart. *due_by* (µs): read
        no key of a task due later; a level's keys run in due order, so those are its tail
        (tasks due later at the head of a level would otherwise be read, a page at a time,
        by every claim)."""
        end = prefix_end(prefix)
        if due_by is not None:
            end = min(end, prefix + b"%017d" % (due_by + 1))
        wkey = prefix + window_of
        window = self.windows.get(wkey)
        if start >= end:
            segments = []  # nothing due from the floor on
        elif window is None:
            segments = [(start, end)]
        else:
            segments = window.segments(prefix, start, end)
        out: list[Any] = []
        keys: list[bytes] = []
        revision = 0
        first_count = 0  # keys in the first range
        spilled = False
        # A whole page in key order, as an unbounded read would give, and *want* accepted.
        for n, (lo, hi) in enumerate(segments):
            spilled = n > 0
            while len(out) < want or len(keys) < page:
                resp = await self._etcd.range(lo, hi, limit=page)
                revision = revision or resp.header.revision
                first_count = first_count or int(resp.count)
                for kv in resp.kvs:
                    keys.append(kv.key)
                    if keep(kv):
                        out.append(kv)
                if not resp.more or not resp.kvs:
                    break
                lo = resp.kvs[-1].key + b"\0"
            if len(out) >= want and len(keys) >= page:
                break
        full = len(out) >= want and len(keys) >= page
        if len(self.windows) >= WINDOW_CACHE and wkey not in self.windows:
            self.windows.clear()  # levels come and go: forget them all now and then
        last = keys[-1] if keys else b""
        self.windows[wkey] = Window.after(
            window, len(prefix), start, last, spilled, first_count, page, full
        )
        p = self.keys.p
        level = p + b"v/" + prefix[len(p) + 2 : -1]
        return out, LevelRead(prefix, level, start[len(prefix) :], revision, keys)

    def fair_turn(self, queue: str, names: Iterable[str]) -> set[str]:
        """Of the fair keys' levels of *queue* among *names*, the ones this read takes: all of
        them up to FAIR_KEYS, else FAIR_KEYS from where the last read's window ended, so that
        with more keys each has its turn."""
        fair = sorted(n for n in names if is_fair_level(n))
        if len(fair) <= FAIR_KEYS:
            return set(fair)
        start = self.fair_turns.get(queue, 0) % len(fair)
        self.fair_turns[queue] = start + FAIR_KEYS
        return set((fair + fair)[start : start + FAIR_KEYS])

    async def of_queue(self, queue: str) -> list[tuple[str, bytes, int]]:
        """(``{inv}``, floor, the key's mod_revision) of each priority level of *queue* that may
        hold pending tasks, best first. No pending task of a level stands below its floor."""
        prefix = self.keys.k("v", enc(queue), "")
        resp = await self._etcd.range(prefix, prefix_end(prefix))
        return [(kv.key[len(prefix) :].decode(), kv.value, kv.mod_revision) for kv in resp.kvs]

    async def every(self, queues: Sequence[str]) -> list[tuple[bytes, bytes]]:
        """(tasks' prefix, floor) of every priority level of these queues."""
        listed = await asyncio.gather(*(self.of_queue(q) for q in dict.fromkeys(queues)))
        return [
            (self.keys.k("q", enc(q), inv, ""), floor)
            for q, levels in zip(dict.fromkeys(queues), listed, strict=True)
            for inv, floor, _ in levels
        ]

    @staticmethod
    def rises(tids: Sequence[str], reads: dict[str, LevelRead]) -> list[Op]:
        """Raise the floor of each level these tasks head (claimed in one transaction):
        the next claims read from where the live tasks begin, not through the deleted
        keys etcd keeps until its history is compacted. The next claim of this instance
        reads from the raised floor (if the raise did not land, v/ lists a lower floor
        and the level is read again from there)."""
        taken = set(tids)
        levels = {id(r): r for t in tids if (r := reads.get(t)) is not None}
        return [op for r in levels.values() if (op := r.rise(taken)) is not None][:RISE_OPS]

    def risen(self, ops: Iterable[Op]) -> None:
        """Remember the floors a landed claim raised (if a raise did not land, v/ lists
        a lower floor next time, and the level is read again from there)."""
        for op in ops:
            if op[0] == RAISE:
                queue, inv = op[1][self._levels_base :].decode().split("/")
                self.known.setdefault(unenc(queue), {})[inv] = op[3]
