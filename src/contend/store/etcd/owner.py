"""Owner writes: start, checkpoint, complete, fail and release, each fenced.

Every owner write reads the task and its owner's session key ``l/{expert}`` (on the
session's lease), asks ``contend.domain.transitions`` whether the writer holds the task
(``refusal``: fence, owner, state, and whether the session the record names is still live) and
what the write leads to, and commits the outcome with a Txn comparing the task's
``mod_revision`` and the session key's value. The writes of one batch share a Txn (as many as
``max_txn_ops`` allows) and fall back to one Txn per task when any of them moved. After this
instance's own claim, what the claim wrote stands in for the read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from contend.domain import transitions as rules
from contend.domain.task import TaskState
from contend.domain.transitions import Holding, Outcome
from contend.errors import FencedOut, StoreError
from contend.store._common import check_retry_delay
from contend.store.etcd.dependants import Dependants
from contend.store.etcd.keys import Keys
from contend.store.etcd.outcomes import apply_outcome
from contend.store.etcd.ownership import Batches
from contend.store.etcd.record import KV, Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Claimed
from contend.store.etcd.txn import WRITE_RETRIES, Op, delete, mod_is, put, value_is
from contend.store.port import Completion, Failure

#: How many claimed tasks' keys one store instance remembers, to write them without a read.
OWNED_CACHE = 16_384

#: What a write does to a record that passed the checks, at a time: its operations.
Apply = Callable[[Record, float], list[Any]]
#: task id -> the task key and the owner's session key (l/), and the record, as this
#: instance's claim wrote and compared them.
Owned = dict[str, tuple[KV, KV, Record]]
States = frozenset[TaskState]


def remember_owned(
    owned: Owned, tid: str, task_put: Op, session: KV, rev: int, rec: Record
) -> None:
    """Keep the task key as a claim of this instance put it at *rev*, the session key as
    it compared it, and the record it wrote (not to be changed after)."""
    owned[tid] = (KV(task_put[1], task_put[2], rev), session, rec)
    while len(owned) > OWNED_CACHE:  # tasks lost to expiry are never written again
        del owned[next(iter(owned))]


def refusal(
    expert: str,
    task_id: str,
    fence: int,
    states: States,
    rec: Record | None,
    claimed: bool,
    now: float,
) -> FencedOut | None:
    """The domain's refusal of *expert*'s write to *rec* at *fence* (None: no such task), or
    None. *claimed*: the session the record names is live (its l/ key, on the session's
    lease, names it): while it is, the lease is live (its deadline is etcd's to keep), and
    once it vanished the lease lapsed."""
    holding = None
    if rec is not None:
        holding = Holding(rec.fence, rec.owner, rec.state, now if claimed else None)
    return rules.refusal(task_id, fence, expert, holding, now, expert_live=True, states=states)


def check_owner(
    expert: str, task_id: str, fence: int, states: States, t: Any, s: Any, now: float
) -> Record | FencedOut:
    """The task record when *expert* may write it at *fence*, else why not; *s* is the
    expert's session key as read (None: no live session)."""
    rec = None if t is None else Record.loads(t.value)
    claimed = s is not None and rec is not None and json.loads(s.value)["session"] == rec.session
    refused = refusal(expert, task_id, fence, states, rec, claimed, now)
    if refused is not None:
        return refused
    assert rec is not None
    return rec


class OwnerWrites:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        clock: Callable[[], float],
        owned: Owned,
        claimed: Claimed,
        batches: Batches,
        dependants: Dependants,
        touch: Callable[[bool], None],
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self._owned = owned
        self._claimed = claimed
        self._batches = batches
        self._dependants = dependants
        self._touch = touch

    # -- the six writes ----------------------------------------------------------------------
    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        started = rules.started(expert)
        return await self._transition(expert, items, rules.START_STATES, [started] * len(items))

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        def apply(rec: Record, now: float) -> list[Any]:
            rec.updated_at = now
            rec.checkpointed = True
            return [
                put(self._keys.task(rec.id), rec.dumps()),
                put(self._keys.data(rec.id, "checkpoint"), state_json),
            ]

        self._owned.pop(task_id, None)  # the task key moves: the next write reads it
        res = await self._write(expert, task_id, fence, rules.WRITE_STATES, apply)
        if res is not None:
            raise res

    async def progress(self, expert: str, task_id: str, fence: int, progress_json: str) -> None:
        def apply(rec: Record, now: float) -> list[Any]:
            rec.updated_at = now
            rec.progress = progress_json
            return [put(self._keys.task(rec.id), rec.dumps())]

        self._owned.pop(task_id, None)  # the task key moves: the next write reads it
        res = await self._write(expert, task_id, fence, rules.WRITE_STATES, apply)
        if res is not None:
            raise res

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        outcomes = [rules.completed(expert, i.result_json) for i in items]
        tasks = [(i.task_id, i.fence) for i in items]
        return await self._transition(expert, tasks, rules.WRITE_STATES, outcomes)

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        for i in items:
            check_retry_delay(i.retry_delay)
        outcomes = [rules.failed(expert, i.error_json, i.retry_delay, i.final_state) for i in items]
        tasks = [(i.task_id, i.fence) for i in items]
        return await self._transition(expert, tasks, rules.WRITE_STATES, outcomes)

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        released = rules.released(expert)
        return await self._transition(expert, items, rules.WRITE_STATES, [released] * len(items))

    async def _transition(
        self,
        expert: str,
        items: Sequence[tuple[str, int]],
        states: States,
        outcomes: Sequence[Outcome],
    ) -> list[FencedOut | None]:
        """Apply the n-th outcome to the n-th task (id, fence) where *expert* holds it; then
        tell the waiters of the tasks that ended, and wake this process's waiters when a
        task left its owner."""
        keys = self._keys
        ended: set[str] = set()  # tasks that ended with waiters to tell
        limited: set[str] = set()  # tasks that held a limit key's slot

        def apply(n: int) -> Apply:
            outcome = outcomes[n]

            def ops(rec: Record, now: float) -> list[Any]:
                ended.discard(rec.id)  # a write retried after a race decides again
                if rec.has_waiters and outcome.ends:
                    ended.add(rec.id)
                if rec.limit_key is not None:
                    limited.add(rec.id)
                out = apply_outcome(keys, rec, outcome, now)
                out.append(put(keys.task(rec.id), rec.dumps()))
                return out

            return ops

        leaving = {n for n, o in enumerate(outcomes) if not o.owned}
        out = await self._write_many(expert, items, states, apply, leaving)
        landed = [n for n, res in enumerate(out) if res is None]
        for n in landed:
            if n in leaving:
                self._claimed.forget(items[n][0])
                self._batches.left(*items[n])
        await self._dependants.settle_many([items[n][0] for n in landed if items[n][0] in ended])
        left = [n for n in landed if not outcomes[n].owned]
        if left:
            # wakes result() waiters of this process; this process's idle experts only when
            # a limit key's slot came free (what it makes pending again, the watch on q/ tells)
            self._touch(any(items[n][0] in limited for n in left))
        return out

    # -- how they are written ----------------------------------------------------------------
    async def _write(
        self,
        expert: str,
        task_id: str,
        fence: int,
        states: States,
        apply: Apply,
        first: tuple[Any, Any] | None = None,
    ) -> FencedOut | None:
        """Check owner, fence, state and live session, then commit *apply*'s operations in
        one Txn that compares the task's revision and the session key as read; re-read when
        either moved. *first* is the (task, session) pair already read for the first try."""
        tkey, skey = self._keys.task(task_id), self._keys.session(expert)
        for _ in range(WRITE_RETRIES):
            if first is not None:
                (t, c), first = first, None
            else:
                t, c = await self._etcd.read_many([tkey, skey])
            now = self._clock()
            checked = check_owner(expert, task_id, fence, states, t, c, now)
            if isinstance(checked, FencedOut):
                return checked
            rec = checked
            ops = apply(rec, now)
            resp = await self._etcd.commit(
                [mod_is(tkey, t.mod_revision), value_is(skey, c.value)], ops
            )
            if resp is None or resp.succeeded:
                return None
        raise StoreError(f"task {task_id} kept changing; gave up after {WRITE_RETRIES} tries")

    async def _write_many(
        self,
        expert: str,
        items: Sequence[tuple[str, int]],
        states: States,
        apply: Callable[[int], Apply],
        leaving: Collection[int] = (),
    ) -> list[FencedOut | None]:
        """Owner writes of a batch: one read for all, then the writes that pass the checks
        grouped into as few transactions as etcd's operation limit allows (each compares
        every task's revision and the session key), committed concurrently. When a group's
        transaction fails because one of its tasks moved, each of its tasks is written on
        its own (re-read and re-checked). *apply(n)* gives the operations of the n-th item;
        the items *leaving* end their ownership, and a group's Txn deletes the ownership
        keys that list no other task still held (ownership.py)."""
        known, checks = await self._read_owned(expert, items, states)
        out: list[FencedOut | None] = [None] * len(items)
        groups = self._group(expert, items, states, apply, known, checks, out)
        max_ops = self._etcd.max_ops

        async def write(group: list[tuple[int, list[Any], list[Any]]]) -> None:
            ends = {items[n][0]: items[n][1] for n, _, _ in group if n in leaving}
            room = max_ops - sum(len(ops) for _, _, ops in group)
            closing = self._batches.closing(ends)[: max(0, room)] if ends else []
            if await self._commit_group(group, [delete(k) for k in closing]):
                self._batches.deleted(closing)
                return
            results = await asyncio.gather(
                *(
                    self._write(expert, items[n][0], items[n][1], states, apply(n))
                    for n, _, _ in group
                )
            )
            for (n, _, _), res in zip(group, results, strict=True):
                out[n] = res

        await asyncio.gather(*(write(g) for g in groups))
        return out

    async def _read_owned(
        self, expert: str, items: Sequence[tuple[str, int]], states: States
    ) -> tuple[list[tuple[Any, Any]], dict[int, Record]]:
        """The (task, session key) pair of each item, and the records already checked (by
        their place in *items*). What this instance's own claim wrote stands in for a read:
        the transaction compares both, so a task that changed since makes it fail and be
        re-read."""
        known: list[tuple[Any, Any] | None] = []
        checks: dict[int, Record] = {}
        now = self._clock()
        for n, (tid, fence) in enumerate(items):
            mine = self._owned.pop(tid, None)
            if mine is not None and refusal(expert, tid, fence, states, mine[2], True, now) is None:
                known.append((mine[0], mine[1]))
                checks[n] = mine[2]
            else:
                known.append(None)  # decide refusals on what etcd holds now
        unknown = [n for n, k in enumerate(known) if k is None]
        keys = self._keys
        if unknown:
            reads = await self._etcd.read_many(
                [*(keys.task(items[n][0]) for n in unknown), keys.session(expert)]
            )
            for i, n in enumerate(unknown):
                known[n] = (reads[i], reads[-1])
        return [k or (None, None) for k in known], checks

    def _group(
        self,
        expert: str,
        items: Sequence[tuple[str, int]],
        states: States,
        apply: Callable[[int], Apply],
        known: list[tuple[Any, Any]],
        checks: dict[int, Record],
        out: list[FencedOut | None],
    ) -> list[list[tuple[int, list[Any], list[Any]]]]:
        """The writes that pass the checks as groups of (item, compares, operations), each
        group one transaction; the refusals go into *out*."""
        groups: list[list[tuple[int, list[Any], list[Any]]]] = [[]]
        n_cmp = n_ops = 0
        in_group: set[str] = set()
        compared: set[bytes] = set()  # the session key, compared once a group
        max_ops = self._etcd.max_ops
        now = self._clock()
        for n, (tid, fence) in enumerate(items):
            t, c = known[n]
            checked = checks.pop(n, None) or check_owner(expert, tid, fence, states, t, c, now)
            if isinstance(checked, FencedOut):
                out[n] = checked
                continue
            assert t is not None and c is not None  # the checks passed
            ops = apply(n)(checked, now)
            cmp = [mod_is(t.key, t.mod_revision)]
            # A key may appear once per transaction: a repeated task starts a new group.
            if groups[-1] and (
                tid in in_group or n_cmp + 2 > max_ops or n_ops + len(ops) > max_ops
            ):
                groups.append([])
                n_cmp = n_ops = 0
                in_group = set()
                compared = set()
            if c.key not in compared:
                compared.add(c.key)
                cmp.append(value_is(c.key, c.value))
            groups[-1].append((n, cmp, ops))
            in_group.add(tid)
            n_cmp += len(cmp)
            n_ops += len(ops)
        return groups

    async def _commit_group(
        self, group: list[tuple[int, list[Any], list[Any]]], more: list[Op]
    ) -> bool:
        """Commit a group's writes, and the operations *more*, in one transaction; False
        when one of its tasks moved."""
        if not group:
            return False
        resp = await self._etcd.commit(
            [x for _, cmp, _ in group for x in cmp],
            [*(x for _, _, ops in group for x in ops), *more],
        )
        return resp is None or bool(resp.succeeded)
