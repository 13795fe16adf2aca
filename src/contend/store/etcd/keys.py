"""The key layout (drawn in full in docs/etcd.md, "Key layout"): every key lives under the
store's prefix, and ids, queue names and expert ids in keys are percent-encoded, so that a
``/`` in a name can never be read as a separator."""

from __future__ import annotations

import functools
from urllib.parse import quote, unquote

from contend.store.etcd.record import Record

#: Priorities are stored as PRIORITY_BASE − priority on 8 digits (a range read then yields
#: the highest first); priorities are within ±1,000,000.
PRIORITY_BASE = 10_000_000


@functools.lru_cache(maxsize=8192)
def enc(name: str) -> str:
    return quote(name, safe="")


def unenc(text: str) -> str:
    return unquote(text)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with *prefix*."""
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


def is_fair_level(inv: str) -> bool:
    """Whether the level ``{inv}`` under a queue is a fair key's (``{inv}.{fair key}``)."""
    return len(inv) > 8


def micros(t: float) -> int:
    return max(0, round(t * 1_000_000))


class Keys:
    """The keys of one store, under its prefix *p* (which ends in ``/``)."""

    __slots__ = ("p",)

    def __init__(self, prefix: bytes) -> None:
        self.p = prefix

    def k(self, *parts: str) -> bytes:
        return self.p + "/".join(parts).encode()

    def task(self, tid: str) -> bytes:
        """``t/{task}``: the task record."""
        return self.k("t", enc(tid))

    def data(self, tid: str, what: str) -> bytes:
        """``d/{task}/{what}``: a payload too big for the record (args, result, checkpoint)."""
        return self.k("d", enc(tid), what)

    def session(self, expert: str) -> bytes:
        """``l/{expert}``: the expert's live session, on its lease; the only key on a lease,
        which every owner write compares."""
        return self.k("l", enc(expert))

    def batch(self, expert: str, session: str, batch: str) -> bytes:
        """``h/{expert}/{session}/{batch}``: an ownership key, the tasks one claim Txn took
        (ownership.py), without a lease."""
        return self.k("h", enc(expert), enc(session), batch)

    def batches(self, expert: str, session: str | None = None) -> bytes:
        """``h/{expert}/``: the prefix of an expert's ownership keys (of one session:
        ``h/{expert}/{session}/``)."""
        if session is None:
            return self.k("h", enc(expert), "")
        return self.k("h", enc(expert), enc(session), "")

    def legacy_held(self, expert: str) -> bytes:
        """``a/{expert}/``: the prefix of schema 5's ownership keys, one per task; an upgraded
        store may keep some of a session that ended before it (expire() returns them)."""
        return self.k("a", enc(expert), "")

    def holders(self, limit_key: str) -> bytes:
        """``n/{limit key}/``: the prefix of the holder keys of a limit key, one
        ``n/{limit key}/{task}`` per task of it claimed or running."""
        return self.k("n", enc(limit_key), "")

    def holder(self, limit_key: str, tid: str) -> bytes:
        """``n/{limit key}/{task}``: *tid* holds one of its limit key's places."""
        return self.k("n", enc(limit_key), enc(tid))

    def rate(self, limit_key: str) -> bytes:
        """``r/{limit key}``: the key's rate and its GCRA state, ``{"interval", "burst",
        "tat"}`` (rates.py)."""
        return self.k("r", enc(limit_key))

    def auction(self, tid: str) -> bytes:
        """``u/{task}``: the task's auction (its close and grace), put by the first bid."""
        return self.k("u", enc(tid))

    def bids(self, tid: str) -> bytes:
        """``b/{task}/``: the prefix of the task's bids, ``b/{task}/{expert}`` each."""
        return self.k("b", enc(tid), "")

    @staticmethod
    def level(rec: Record) -> str:
        """``{queue}/{inv}``: the priority level of *rec* (under q/ its tasks, under v/ its
        key); ``{queue}/{inv}.{fair key}`` for a fair task: each fair key has a level of its
        own at each priority, so that a claim reads the head of every key (fair.py)."""
        level = f"{enc(rec.queue)}/{PRIORITY_BASE - rec.priority:08d}"
        if rec.fair and rec.limit is not None:
            return f"{level}.{enc(str(rec.limit[0]))}"
        return level

    @staticmethod
    def spot(rec: Record) -> str:
        """``{due}/{id}``: where *rec* stands within its priority level."""
        return f"{micros(rec.run_at):017d}/{enc(rec.id)}"

    def pending(self, rec: Record) -> bytes:
        """``q/{queue}/{inv}/{due}/{task}``: *rec*'s key in the priority index; a central
        task's key in the central index instead (:meth:`central`)."""
        if rec.central:
            return self.central(rec)
        return self.k("q", self.level(rec), self.spot(rec))

    def leadership(self, name: str) -> bytes:
        """``leader/{name}``: a central queue's leadership, ``{"holder", "session", "term",
        "deadline"}`` (dispatch.py)."""
        return self.k("leader", enc(name))

    def unassigned(self, queue: str) -> bytes:
        """``z/{queue}/u/``: the prefix of a central queue's pending tasks no leader gave to
        anyone, ``z/{queue}/u/{inv}/{due}/{task}`` each."""
        return self.k("z", enc(queue), "u", "")

    def assigned(self, queue: str, expert: str | None = None) -> bytes:
        """``z/{queue}/a/{expert}/``: the prefix of the pending central tasks given to
        *expert*, ``z/{queue}/a/{expert}/{inv}/{due}/{task}`` each (None: of every expert)."""
        if expert is None:
            return self.k("z", enc(queue), "a", "")
        return self.k("z", enc(queue), "a", enc(expert), "")

    def central(self, rec: Record) -> bytes:
        """A pending central task's key in the central index: under its assignee's prefix,
        or the queue's unassigned one. Out of q/, so that no compete claim, peek or level
        sweep ever reads a central backlog."""
        base = (
            self.unassigned(rec.queue)
            if rec.assignee is None
            else self.assigned(rec.queue, rec.assignee)
        )
        return base + f"{PRIORITY_BASE - rec.priority:08d}/{self.spot(rec)}".encode()
