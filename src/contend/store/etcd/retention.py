"""Retention: prune() deletes finished tasks last changed before a given time, whole
(``contend.domain.retention`` says which; docs/etcd.md, "Retention", what a pass costs).

etcd holds no index of finished tasks by time, so a pass reads a bounded window of task
records: at most ``SCAN_PER_TASK`` × *limit* (at least ``SCAN_MIN``), in pages, and remembers
nothing between passes. Half of the window is the head of ``t/``: ids made by
``new_task_id`` sort by creation time, so these are the oldest tasks, and a store that fits in
it is read whole (then "oldest first" and "0: nothing left" are exact). The other half starts
at a random creation time between the head's end and *before*, so that a backlog of old
unfinished tasks at the head cannot keep every later pass from the finished tasks behind it.

A task goes with every key it owns: its record, ``d/{task}/`` (payloads, checkpoint), its
``k/`` key when that still names it, ``q/`` (none once finished, deleted all the
same), its auction (``u/``, ``b/``), its edges as a waiter (``w/{dependency}/{task}``) and
as a dependency (``w/{task}/``). A task with an ``s/`` marker (its waiters not yet told) or
with an edge of a waiting waiter stays; one that has told its waiters (settle() deletes the
edges) goes even while they wait on other tasks: nothing reads it any more. Each deletion compares the record's ``mod_revision``: a task
retried or otherwise changed since it was read is left alone. Tasks are deleted several to a
Txn, as ``max_txn_ops`` allows.

History is not trimmed here: a record keeps at most ``HISTORY_LIMIT`` events, capped as it is
written, so *keep_events* of that or more is honoured as it stands, and a smaller one is not
applied (it would rewrite every record it trims, a full put each, to save a few events of
tasks that go whole once they are old enough)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from contend.domain.retention import PRUNABLE_STATES, check_prune
from contend.domain.task import TaskState
from contend.store.etcd.keys import Keys, enc, prefix_end, unenc
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import Op, delete, get, mod_is, value_is

#: A pass reads at most this many task records per task it may delete, and at least SCAN_MIN.
SCAN_PER_TASK = 4
SCAN_MIN = 1000
#: Task records read per range call.
PAGE = 500
_FINISHED = frozenset(str(s) for s in PRUNABLE_STATES)


@dataclass(slots=True)
class Found:
    """A finished task old enough, as read: its record and the record's revision."""

    rec: Record
    mod: int


@dataclass(slots=True)
class Plan:
    """What deleting one task takes: the compares and operations of its part of a Txn, and
    the deletions of its edges as a waiter beyond what one Txn holds (sent first)."""

    tid: str
    cmp: list[Op]
    ops: list[Op]
    extra: list[Op] = field(default_factory=list)


def scan_budget(limit: int) -> int:
    """How many task records a pass that may delete *limit* tasks reads at most."""
    return max(SCAN_MIN, SCAN_PER_TASK * limit)


def id_time(tid: str) -> float | None:
    """When an id of ``new_task_id``'s form was made (its first 48 bits, in milliseconds);
    None for an id of another form."""
    if len(tid) != 28:
        return None
    try:
        return int(tid[:12], 16) / 1000
    except ValueError:
        return None


class Retention:
    def __init__(self, etcd: Etcd, keys: Keys) -> None:
        self._etcd = etcd
        self._keys = keys

    async def prune(self, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
        """Delete up to *limit* finished tasks last changed before *before*, oldest first of
        those a bounded window of records holds (the module's docstring); how many went.
        *keep_events* is checked, and honoured up to ``HISTORY_LIMIT``, as records are
        written."""
        before, limit, _ = check_prune(before, limit, keep_events)
        found = await self._window(before, scan_budget(limit))
        found.sort(key=lambda f: (f.rec.updated_at, f.rec.id))
        deleted, at = 0, 0
        while deleted < limit and at < len(found):
            chunk = found[at : at + min(limit - deleted, self._etcd.max_ops)]
            at += len(chunk)
            deleted += await self._delete(await self._plans(chunk))
        return deleted

    # -- finding ------------------------------------------------------------------------------
    async def _window(self, before: float, budget: int) -> list[Found]:
        """The finished tasks changed before *before* among at most *budget* records: the
        head of ``t/``, then a stretch from a random creation time after it."""
        base = self._keys.k("t", "")
        end = prefix_end(base)
        head = (budget + 1) // 2
        found, last = await self._read(base, end, head, before)
        if last is None:  # the head held every record
            return found
        last_key, last_made = last
        if last_made < before:
            at = random.uniform(last_made, before)
            start = max(last_key + b"\0", self._keys.task(f"{int(at * 1000):012x}"))
            more, _ = await self._read(start, end, budget - head, before)
            found += more
        return found

    async def _read(
        self, start: bytes, end: bytes, budget: int, before: float
    ) -> tuple[list[Found], tuple[bytes, float] | None]:
        """The finished tasks changed before *before* among up to *budget* records from
        *start*; and the key of the last record read and when it was made, when more
        follow."""
        out: list[Found] = []
        read = 0
        while read < budget:
            resp = await self._etcd.range(start, end, limit=min(PAGE, budget - read))
            for kv in resp.kvs:
                rec = Record.loads(kv.value)
                if rec.state in _FINISHED and rec.updated_at < before:
                    out.append(Found(rec, int(kv.mod_revision)))
            read += len(resp.kvs)
            if not resp.more or not resp.kvs:
                return out, None
            start = resp.kvs[-1].key + b"\0"
        made = id_time(rec.id)
        return out, (resp.kvs[-1].key, rec.created_at if made is None else made)

    # -- planning -----------------------------------------------------------------------------
    async def _plans(self, found: Sequence[Found]) -> list[Plan]:
        """The deletion of each task of *found* that no waiting task waits on."""
        keys = self._keys
        ops: list[Op] = []
        for f in found:
            r = f.rec
            if r.key is not None:
                ops.append(get(keys.k("k", enc(r.key))))
            if r.has_waiters:
                ops.append(get(keys.k("s", enc(r.id)), keys_only=True))
                ops.append(get(keys.k("w", enc(r.id), ""), prefix=True, keys_only=True))
        reads = iter(await self._reads(ops))
        named: dict[str, bool] = {}  # does its k/ key name it
        waiters: dict[str, list[bytes]] = {}  # its edges as a dependency
        for f in found:
            r = f.rec
            if r.key is not None:
                kvs = next(reads).kvs
                named[r.id] = bool(kvs) and kvs[0].value.decode() == r.id
            if r.has_waiters:
                marked, edges = next(reads).kvs, next(reads).kvs
                if marked:
                    continue  # ended with waiters still to be told: settle() needs it
                waiters[r.id] = [e.key for e in edges]
        waiting = await self._waiting(waiters)
        return [
            self._plan(f, named.get(f.rec.id, False), waiters.get(f.rec.id, []))
            for f in found
            if not f.rec.has_waiters or (f.rec.id in waiters and f.rec.id not in waiting)
        ]

    async def _waiting(self, edges: dict[str, list[bytes]]) -> set[str]:
        """The tasks among *edges*' keys that a waiting task still waits on. A waiter that is
        not waiting never waits again (nothing moves back to waiting): its edge is garbage."""
        keys = self._keys
        owner: list[tuple[str, str]] = []  # (dependency, waiter)
        for tid, found in edges.items():
            base = len(keys.k("w", enc(tid), ""))
            owner += [(tid, unenc(e[base:].decode())) for e in found]
        kvs = await self._etcd.read_many([keys.task(w) for _, w in owner])
        return {
            tid
            for (tid, _), kv in zip(owner, kvs, strict=True)
            if kv is not None and Record.loads(kv.value).state == TaskState.WAITING
        }

    def _plan(self, f: Found, named: bool, edges: list[bytes]) -> Plan:
        keys, rec, tid = self._keys, f.rec, f.rec.id
        tkey = keys.task(tid)
        cmp = [mod_is(tkey, f.mod)]
        ops = [
            delete(tkey),
            delete(keys.k("d", enc(tid), ""), prefix=True),
            delete(keys.auction(tid)),
            delete(keys.bids(tid), prefix=True),
        ]
        if named:
            assert rec.key is not None
            kk = keys.k("k", enc(rec.key))
            cmp.append(value_is(kk, tid.encode()))
            ops.append(delete(kk))
        if rec.indexed:
            ops.append(delete(keys.pending(rec)))
        if edges:
            ops.append(delete(keys.k("w", enc(tid), ""), prefix=True))
        mine = [delete(keys.k("w", enc(d), enc(tid))) for d in rec.depends_on]
        room = self._etcd.max_ops - len(ops)
        return Plan(tid, cmp, ops + mine[:room], mine[room:])

    # -- deleting -----------------------------------------------------------------------------
    async def _delete(self, plans: list[Plan]) -> int:
        """Carry out *plans*, several to a Txn; a Txn that fails (one of its tasks changed)
        is tried again task by task. Returns how many tasks went."""
        deleted = 0
        for batch in self._pack(plans):
            if len(batch) > 1:
                cmp = [c for p in batch for c in p.cmp]
                ops = [o for p in batch for o in p.ops]
                if (await self._etcd.txn(cmp, ops)).succeeded:
                    deleted += len(batch)
                    continue
            for p in batch:
                deleted += await self._delete_one(p)
        return deleted

    async def _delete_one(self, plan: Plan) -> int:
        """One task alone: its extra edges first, each Txn under the record's revision."""
        etcd, check = self._etcd, plan.cmp[:1]
        for i in range(0, len(plan.extra), etcd.max_ops):
            if not (await etcd.txn(check, plan.extra[i : i + etcd.max_ops])).succeeded:
                return 0
        return 1 if (await etcd.txn(plan.cmp, plan.ops)).succeeded else 0

    def _pack(self, plans: list[Plan]) -> list[list[Plan]]:
        """*plans* in groups whose compares and operations each fit in one Txn; a plan with
        extra edges is a group of its own."""
        max_ops = self._etcd.max_ops
        out: list[list[Plan]] = []
        batch: list[Plan] = []
        n_cmp = n_ops = 0
        for p in plans:
            if p.extra:
                out.append([p])
                continue
            if batch and (n_cmp + len(p.cmp) > max_ops or n_ops + len(p.ops) > max_ops):
                out.append(batch)
                batch, n_cmp, n_ops = [], 0, 0
            batch.append(p)
            n_cmp, n_ops = n_cmp + len(p.cmp), n_ops + len(p.ops)
        if batch:
            out.append(batch)
        return out

    async def _reads(self, ops: list[Op]) -> list[Any]:
        """Range responses of *ops*, in reads of at most ``max_ops`` each."""
        out: list[Any] = []
        step = self._etcd.max_ops
        for i in range(0, len(ops), step):
            out += await self._etcd.reads(ops[i : i + step])
        return out
