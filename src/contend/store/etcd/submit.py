"""Submission: a batch of task specs becomes task records, index keys, idempotency keys
(``k/{key}``, the id the key was first used for) and dependency edges, in as few transactions
as ``max_txn_ops`` allows. Every check (unknown dependency, cycle) runs before the first
transaction, so a refused submission writes nothing; but an etcd failure between two of them
leaves the earlier tasks in (sending the same specs again completes it: ids are recognised)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from contend.domain import transitions as rules
from contend.domain.task import TaskSpec, TaskState
from contend.domain.transitions import Birth
from contend.errors import StoreError
from contend.store._common import check_batch_dependencies, refuse_limits, sort_out
from contend.store.etcd.keys import Keys, enc
from contend.store.etcd.levels import enter_pending
from contend.store.etcd.rates import declare, declared
from contend.store.etcd.record import INLINE_MAX, Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import WRITE_RETRIES, absent, mod_is, put
from contend.store.port import Promises, Submitted

#: One task's part of a submission: (its id, compares, operations).
Group = tuple[str, list[Any], list[Any]]


def births(fresh: Sequence[TaskSpec], deps: dict[str, Record]) -> dict[str, Birth]:
    """How each new task starts, as ``contend.domain.transitions.submitted`` decides from the
    states of its dependencies: those in the store (*deps*), and those of the batch, which
    are unfinished unless they are dead at birth themselves."""
    states = {d: TaskState(rec.state) for d, rec in deps.items()}
    born = {spec.id: rules.submitted(spec.depends_on, states, spec.if_failed) for spec in fresh}
    inside = [spec for spec in fresh if any(d in born for d in spec.depends_on)]
    grew = True
    while grew:  # a member of the batch ended at birth settles its dependants in the batch
        grew = False
        for tid, birth in born.items():
            if birth.state.terminal and tid not in states:
                states[tid] = birth.state
                grew = True
        if grew:
            for spec in inside:
                born[spec.id] = rules.submitted(spec.depends_on, states, spec.if_failed)
    return born


def new_record(
    spec: TaskSpec, state: TaskState, error_json: str | None, deps_left: int, now: float
) -> Record:
    """The record of a task just submitted."""
    return Record(
        id=spec.id,
        type=spec.type,
        queue=spec.queue,
        state=str(state),
        priority=spec.priority,
        key=spec.key,
        req=spec.requirements.to_json(),
        attempts=0,
        max_attempts=spec.max_attempts,
        fence=0,
        owner=None,
        session=None,
        lease_deadline=None,
        run_at=now + spec.delay,
        created_at=now,
        updated_at=now,
        timeout=spec.timeout,
        error=error_json,
        depends_on=list(spec.depends_on),
        if_failed=list(spec.if_failed) or None,
        deps_left=deps_left,
        has_waiters=False,
        indexed=False,
        history=[],
        trace=spec.trace,
        limit=None if spec.limit_key is None else [spec.limit_key, spec.concurrency_limit],
        rate=None if spec.rate_limit is None else [spec.rate_limit.interval, spec.rate_limit.burst],
        fair=spec.fair,
        central=spec.central,
    )


#: What this backend keeps (``Store.promises``); submit refuses what it does not. A
#: submission goes into as few Txns as ``max_txn_ops`` allows (about a quarter of it in tasks
#: without dependencies); only a single task is promised to be written all or none. A task's
#: own transaction is one Txn with its completion (transactions.py). Claims keep
#: concurrency limits (claims.py, holder keys n/), rate limits (rates.py, r/ keys) and fair
#: share (fair.py).
PROMISES = Promises(
    atomic_submit=1,
    transactions=True,
    concurrency_limits=True,
    rate_limits=True,
    fair_share=True,
    central_dispatch=True,
)


class Submitter:
    def __init__(
        self, etcd: Etcd, keys: Keys, clock: Callable[[], float], touch: Callable[[], None]
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self._touch = touch

    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        refuse_limits(specs, "etcd", PROMISES)
        landed: set[str] = set()
        # The first try takes every spec for new without reading: its transaction's compares
        # (no such task, no such key) check that, and a plain submit costs one round trip
        # instead of two. A spec sent again or whose key is taken fails them, and the tries
        # after read and sort the specs out.
        read = False
        for _ in range(WRITE_RETRIES):
            out = await self._try(specs, landed, read)
            read = True
            if out is not None:
                if landed:
                    self._touch()
                return out
        raise StoreError(f"submission kept conflicting; gave up after {WRITE_RETRIES} tries")

    async def _try(
        self, specs: Sequence[TaskSpec], landed: set[str], read: bool
    ) -> list[Submitted] | None:
        """One try; None when a transaction lost a race (ids written so far are in *landed*).
        Without *read*, every spec not in *landed* is taken for new."""
        if not specs:
            return []
        now = self._clock()
        if read:
            out, fresh = await self._sort_out(specs, landed)
        else:
            fresh, out = sort_out(specs, (), {}, landed)
        outside = sorted({d for s in fresh for d in s.depends_on} - {s.id for s in fresh})
        dep_kvs = dict(
            zip(
                outside,
                await self._etcd.read_many([self._keys.task(d) for d in outside]),
                strict=True,
            )
        )
        check_batch_dependencies(fresh, lambda ids: {i for i in ids if dep_kvs.get(i) is not None})
        groups = self._groups(fresh, dep_kvs, now)
        await self._declare_rates(fresh, groups)
        for ids, cmp, ops in self._pack(groups):
            if not (await self._etcd.txn(cmp, ops)).succeeded:
                # A concurrent submission took an idempotency key, or a dependency changed.
                # Nothing of this transaction landed; the caller starts over from a fresh read.
                return None
            landed.update(ids)
        return out

    async def _sort_out(
        self, specs: Sequence[TaskSpec], landed: set[str]
    ) -> tuple[list[Submitted], list[TaskSpec]]:
        """What each spec comes to, and the specs of new tasks not written yet: a spec sent
        again (a client that lost the reply) or whose idempotency key is taken keeps the task
        that is there."""
        etcd, keys = self._etcd, self._keys
        ids_read = await etcd.read_many([keys.task(s.id) for s in specs])
        known = {s.id for s, kv in zip(specs, ids_read, strict=True) if kv} - landed
        keyed = list(dict.fromkeys(s.key for s in specs if s.key is not None))
        key_kvs = await etcd.read_many([keys.k("k", enc(k)) for k in keyed])
        existing = {
            k: kv.value.decode()
            for k, kv in zip(keyed, key_kvs, strict=True)
            if kv and kv.value.decode() not in landed
        }
        fresh, out = sort_out(specs, known, existing, landed)
        return out, fresh

    def _groups(
        self, fresh: Sequence[TaskSpec], dep_kvs: dict[str, Any], now: float
    ) -> list[Group]:
        """One group of operations per new task (*dep_kvs*: its dependencies outside the
        batch, as read); the groups are packed into transactions."""
        keys = self._keys
        deps: dict[str, Record] = {d: Record.loads(kv.value) for d, kv in dep_kvs.items() if kv}
        born = births(fresh, deps)
        groups: list[Group] = []
        touched: set[str] = set()
        awaited = {d for s in fresh if not born[s.id].state.terminal for d in s.depends_on}
        for spec in fresh:
            birth = born[spec.id]
            dead = birth.state.terminal
            left = () if dead else birth.waits_on  # a task ended at birth waits on nothing
            rec = new_record(spec, birth.state, birth.error_json, len(left), now)
            if birth.event is not None:
                rec.event(now, birth.event, None, birth.detail)
            cmp: list[Any] = []
            ops: list[Any] = []
            if spec.key is not None:
                kk = keys.k("k", enc(spec.key))
                cmp.append(absent(kk))
                ops.append(put(kk, spec.id))
            for d in left:
                ops.append(put(keys.k("w", enc(d), enc(spec.id)), b""))
                if d in deps and d not in touched:
                    # Mark the dependency as awaited, under a compare on its revision: if it
                    # ends meanwhile, this transaction fails and the submission is re-read.
                    touched.add(d)
                    deps[d].has_waiters = True
                    cmp.append(mod_is(keys.task(d), dep_kvs[d].mod_revision))
                    ops.append(put(keys.task(d), deps[d].dumps()))
            if rec.state == TaskState.PENDING:
                ops += enter_pending(keys, rec)
            if spec.id in awaited and not dead:
                rec.has_waiters = True
            cmp.append(absent(keys.task(spec.id)))
            payload = f"[{spec.args_json},{spec.kwargs_json}]"
            rec.checkpointed = False
            if len(payload) <= INLINE_MAX:
                rec.args = payload
            else:
                ops.append(put(keys.data(spec.id, "args"), payload))
            ops.append(put(keys.task(spec.id), rec.dumps()))
            groups.append((spec.id, cmp, ops))
        return groups

    async def _declare_rates(self, fresh: Sequence[TaskSpec], groups: list[Group]) -> None:
        """Add to the group of the last task declaring each rate key the write of that rate
        (rates.py), so that the key's rate is its latest submission's and lands with it."""
        rates = declared(fresh)
        if not rates:
            return
        kvs = await self._etcd.read_many([self._keys.rate(k) for k in rates])
        last = {s.limit_key: n for n, s in enumerate(fresh) if s.rate_limit is not None}
        for (key, rate), kv in zip(rates.items(), kvs, strict=True):
            cmp, ops = declare(self._keys, key, rate, kv)
            groups[last[key]][1].extend(cmp)
            groups[last[key]][2].extend(ops)

    def _pack(self, groups: list[Group]) -> Iterable[tuple[list[str], list[Any], list[Any]]]:
        """Pack per-task groups of (compares, operations) into transactions of bounded size."""
        max_ops = self._etcd.max_ops
        ids: list[str] = []
        cmp: list[Any] = []
        ops: list[Any] = []
        for tid, gc, go in groups:
            if ids and (len(cmp) + len(gc) > max_ops or len(ops) + len(go) > max_ops):
                yield ids, cmp, ops
                ids, cmp, ops = [], [], []
            ids.append(tid)
            cmp, ops = cmp + gc, ops + go
        if ids:
            yield ids, cmp, ops
