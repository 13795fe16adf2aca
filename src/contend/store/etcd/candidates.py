"""Which pending tasks a claim tries, and in what order.

Ageing is reckoned when claims read, not written: a claim reads the head of each priority
level of a queue (from its floor) and ranks what it read by effective priority (priority
plus the age term, domain.aged_priority, from the due time in the index key), then due time,
then id. As the age runs from the due time, the head of a level (in due order) is also its
best aged. Then it takes the low lane's share of the longest waiting below the
top base priority, the best for the rest and, when rivals have been winning its races, the
best from a random stripe of equally good tasks."""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from contend.domain.limits import FAIR_KEYS
from contend.domain.scoring import TaskView
from contend.domain.task import LANE_LEVELS, Capabilities, Requirements, aged_priority
from contend.store.etcd.fair import fair_keys, fair_pick, running
from contend.store.etcd.keys import PRIORITY_BASE, Keys, enc, is_fair_level, micros, unenc
from contend.store.etcd.levels import LevelRead, Levels
from contend.store.etcd.record import (
    COMPACT_JSON,
    LIM,
    REQ_NONE,
    Record,
    index_json,
    index_limit_key,
)
from contend.store.etcd.rpc import Etcd

#: A spreading claim reads this many times as many candidates as it wants, and takes a stripe.
#: Two is what every claim reads anyway (a page of twice its limit, or 64 keys). Six read
#: 5.5-6.7 index keys per task claimed against 2.3-2.9 and lost no fewer races; at 2 experts
#: × 8 slots the experts spent 90-97 µs per task against 59-73, and etcd 80-94 against 48-55.
SPREAD_DEPTH = 2

Rank = tuple[int, str, str]
#: A candidate: (task id, its rank, its level: (queue, base priority)).
Found = tuple[str, Rank, tuple[str, int]]
#: What the priority index holds of a task a peek returns: (queue, priority, index value).
Views = dict[str, TaskView | tuple[str, int, bytes]]


def rank_of(rec: Record, now: float) -> Rank:
    """A pending task's place in claim order, smallest first: the highest effective
    priority (the priority aged since the task was due, in whole steps), then the
    earliest due time, then the id. candidates() makes the same from index keys."""
    due = micros(rec.run_at)
    return -aged_priority(rec.priority, now - due / 1e6), f"{due:017d}", rec.id


async def choose(
    levels: Levels,
    queues: Sequence[str],
    caps: Capabilities,
    limit: int,
    low_lane: int,
    now: float,
    spread: bool = False,
    views: Views | None = None,
    reads: dict[str, LevelRead] | None = None,
    types: Collection[str] | None = None,
    hidden: Collection[str] = (),
    limits: dict[str, str] | None = None,
) -> list[str]:
    """Ids of the tasks to try, in claim order: *limit* of them as :func:`pick` chooses, then
    more of the best, to try when rivals win some. With *spread* (rivals have been winning
    this instance's races), the best are taken from a random place among the equally good
    candidates read, so that experts reading the same head of the index do not all reach
    for the same tasks. *views* receives what the priority index holds of the candidates it
    read, *reads* the read of each one's level. *types*: only tasks of these types (None:
    any). *hidden*: leave out the tasks of these limit keys (a claim found them with no
    room); *limits* receives the limit key of each candidate that has one. Where fair tasks
    are among the candidates, the order is fair.py's."""
    want = min(SPREAD_DEPTH * limit, 1024) if spread else 0
    fairs: dict[str, str] = {}
    best = await candidates(
        levels, queues, caps, limit, now, want, views, reads, types, hidden, limits, fairs
    )
    if fairs:
        return await pick_fair(levels.etcd, levels.keys, best, fairs, limit, low_lane)
    if spread and best:
        top = best[0][1][0]
        level = next((n for n, f in enumerate(best) if f[1][0] != top), len(best))
        if level > limit:  # more equally good tasks than wanted: take a stripe of them
            shift = limit * random.randrange(level // limit)
            best = best[shift:level] + best[:shift] + best[level:]
    return pick(best, limit, low_lane)


def pick(found: Sequence[Found], limit: int, low_lane: int) -> list[str]:
    """The ids of *found* (claimable tasks, in the order they are preferred: by rank, or
    striped) in the order to try them: first *limit* of them, in rank order, then the rest
    as given. Of the *limit*, up to *low_lane* are the low lane's: the tasks due the longest
    (due time, then id) among those whose base priority is below the highest of *found*, at
    the LANE_LEVELS highest such priorities of each queue; the best take the other places
    (all of them, when nothing stands below the top)."""
    lane = _lane(found, max(0, min(low_lane, limit)))
    chosen = dict.fromkeys(lane)
    for tid, _, _ in found:
        if len(chosen) >= limit:
            break
        chosen.setdefault(tid)
    rank = {f[0]: f[1] for f in found}
    first = sorted(chosen, key=rank.__getitem__)
    return first + [f[0] for f in found if f[0] not in chosen]


async def pick_fair(
    etcd: Etcd,
    keys: Keys,
    found: Sequence[Found],
    fairs: Mapping[str, str],
    limit: int,
    low_lane: int,
) -> list[str]:
    """:func:`pick` with fair share, for *found* among which are the fair tasks *fairs*
    (task id -> its fair key): the fair keys' claimed and running tasks counted, then
    :func:`~contend.store.etcd.fair.fair_pick`."""
    held = await running(etcd, keys, fair_keys(found, fairs))
    return fair_pick(found, fairs, held, limit, _lane(found, max(0, min(low_lane, limit))))


def _lane(found: Sequence[Found], n: int) -> list[str]:
    """The low lane's *n* (or fewer) of *found*, as :func:`pick` tells."""
    if not n or not found:
        return []
    top = max(level[1] for _, _, level in found)
    below: dict[str, list[int]] = {}  # queue -> its base priorities below the top
    for queue, base in {level for _, _, level in found if level[1] < top}:
        below.setdefault(queue, []).append(base)
    if not below:
        return []
    taking = {(q, b) for q, bases in below.items() for b in heapq.nlargest(LANE_LEVELS, bases)}
    oldest = heapq.nsmallest(n, (f for f in found if f[2] in taking), key=lambda f: f[1][1:])
    return [tid for tid, _, _ in oldest]


async def candidates(
    levels: Levels,
    queues: Sequence[str],
    caps: Capabilities,
    limit: int,
    now: float,
    want: int = 0,
    views: Views | None = None,
    reads: dict[str, LevelRead] | None = None,
    types: Collection[str] | None = None,
    hidden: Collection[str] = (),
    limits: dict[str, str] | None = None,
    fairs: dict[str, str] | None = None,
) -> list[Found]:
    """(task id, rank, level) of due tasks *caps* can run (of *types*, when given), best
    first: at least *limit* (or *want*) of each priority level of each queue where there are
    that many, the first in key order (due time, then id), so each level's longest waiting
    among them. *views*, if given, receives what the index holds of each: (queue, priority,
    index value); *reads* the read of its level; *hidden* and *limits* as :func:`choose`
    says; *fairs* receives the fair key of each fair candidate."""
    want = max(want, limit)
    # A claim reads twice what it wants, to have others to try when rivals win some; a
    # peek (which fills *views*) only what it returns.
    page = max(64, limit if views is not None else 2 * limit, want)
    keep = runnable_now(caps, micros(now), types, hidden)
    search = _Search(levels, keep, now, page, want, views, reads, limits, fairs)
    found = [
        f
        for r in await asyncio.gather(*(search.queue(q) for q in dict.fromkeys(queues)))
        for f in r
    ]
    found.sort(key=lambda f: f[1])
    return found


def type_heads(types: Collection[str]) -> tuple[bytes, ...]:
    """How the JSON part of an index value starts for a task of each of *types*
    (:func:`~contend.store.etcd.record.index_value` writes the type first)."""
    return tuple(b'{"type":' + COMPACT_JSON.encode(t).encode() + b"," for t in types)


def runnable_now(
    caps: Capabilities,
    now_us: int,
    types: Collection[str] | None = None,
    hidden: Collection[str] = (),
) -> Callable[[Any], bool]:
    """Whether an index key is of a task due by *now_us* whose requirements *caps* meets and,
    when *types* is given, of one of those types (told from the value without parsing it),
    and not of a limit key in *hidden*."""
    heads = None if types is None else type_heads(types)
    if hidden:
        hide = set(hidden)
        runnable = runnable_now(caps, now_us, types)
        return lambda kv: index_limit_key(kv.value) not in hide and runnable(kv)

    def keep(kv: Any) -> bool:
        due = int(kv.key.rsplit(b"/", 2)[1])  # the due time is in the key
        value = kv.value
        if due > now_us or (
            heads is not None and not value.startswith(heads, value.index(b" ") + 1)
        ):
            return False
        return REQ_NONE in value or caps.satisfies(Requirements.from_json(index_json(value)["req"]))

    return keep


class _Search:
    """One candidates() read: the levels of each queue, read with the same bounds."""

    __slots__ = (
        "due_by",
        "fairs",
        "keep",
        "levels",
        "limits",
        "now",
        "page",
        "reads",
        "views",
        "want",
    )

    def __init__(
        self,
        levels: Levels,
        keep: Callable[[Any], bool],
        now: float,
        page: int,
        want: int,
        views: Views | None,
        reads: dict[str, LevelRead] | None,
        limits: dict[str, str] | None = None,
        fairs: dict[str, str] | None = None,
    ) -> None:
        self.levels, self.keep, self.now = levels, keep, now
        self.due_by = micros(now)  # a level's keys run in due order: read none due later
        self.page, self.want, self.views, self.reads = page, want, views, reads
        self.limits, self.fairs = limits, fairs

    async def queue(self, queue: str) -> list[Found]:
        """Read every level v/ lists, from its floor. The levels seen last time are read
        from the floors seen then, meanwhile; a level whose floor came down since (a task
        entered below it) is read again. Of the fair keys' levels, at most FAIR_KEYS: a
        turn of those seen last time (Levels.fair_turn), and new ones while there is room."""
        known = self.levels.known.get(queue, {})
        turn = self.levels.fair_turn(queue, known)
        first = [(inv, f) for inv, f in known.items() if not is_fair_level(inv) or inv in turn]
        listed, done = await asyncio.gather(self.levels.of_queue(queue), self._levels(queue, first))
        room = FAIR_KEYS - len(turn)
        again = []
        for inv, f, _ in listed:
            if inv in known and f >= known[inv]:
                continue
            if is_fair_level(inv) and inv not in turn:
                if inv in known or room <= 0:
                    continue  # its turn comes
                room -= 1
            again.append((inv, f))
        done.update(await self._levels(queue, again))
        self.levels.known[queue] = {inv: f for inv, f, _ in listed}
        for inv, f, mod in listed:
            if inv in done:
                done[inv][0].floor, done[inv][0].listed_at = f, mod
        found = []
        for read, out in done.values():
            found += out
            if self.reads is not None:
                for tid, _, _ in out:
                    self.reads[tid] = read
        return found

    async def _levels(
        self, queue: str, floors: Iterable[tuple[str, bytes]]
    ) -> dict[str, tuple[LevelRead, list[Found]]]:
        floors = list(floors)
        got = await asyncio.gather(*(self._level(queue, inv, f) for inv, f in floors))
        return dict(zip((inv for inv, _ in floors), got, strict=True))

    async def _level(self, queue: str, inv: str, floor: bytes) -> tuple[LevelRead, list[Found]]:
        """Read one level from *floor*, and rank what it holds (as rank_of does)."""
        prefix = self.levels.keys.k("q", enc(queue), inv, "")
        priority = PRIORITY_BASE - int(inv[:8])  # a fair key's level: {inv}.{key}
        level = (queue, priority)
        aged: dict[str, int] = {}  # tasks submitted together share their due time
        out = []
        # a fair key's level: its tasks are all of that key, and a claim ranks no more than
        # its limit of them (fair.py), so a short page does
        fair_key = unenc(inv[9:]) if is_fair_level(inv) else None
        page, want = self.page, self.want
        if fair_key is not None:
            page = max(8, min(page, 2 * self.want))
            want = min(want, page)
        kvs, read = await self.levels.read(
            prefix, prefix + floor, page, want, self.keep, due_by=self.due_by
        )
        now, views, limits, fairs = self.now, self.views, self.limits, self.fairs
        for kv in kvs:
            due, tid = kv.key[len(prefix) :].decode().split("/")
            tid = unenc(tid) if "%" in tid else tid
            step = aged.get(due)
            if step is None:
                step = aged[due] = aged_priority(priority, now - int(due) / 1e6)
            out.append((tid, (-step, due, tid), level))  # as rank_of
            if views is not None:
                views[tid] = (queue, priority, kv.value)
            if fair_key is not None:
                if limits is not None:
                    limits[tid] = fair_key
                if fairs is not None:
                    fairs[tid] = fair_key
            elif limits is not None and LIM in kv.value:
                key = index_limit_key(kv.value)
                if key is not None:
                    limits[tid] = key
        return read, out
