"""Changes made by hand (the CLI, the dashboard): cancel and retry a task; and two tools,
purge_all() and compact_history(), for benchmarks and tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aetcd import rpc

from contend.domain import transitions as rules
from contend.domain.task import Task, TaskState
from contend.errors import StoreError, TaskNotFound
from contend.store.etcd.dependants import Dependants
from contend.store.etcd.keys import Keys, prefix_end
from contend.store.etcd.outcomes import apply_outcome
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import WRITE_RETRIES, delete, mod_is, put


class Management:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        clock: Callable[[], float],
        dependants: Dependants,
        touch: Callable[[], None],
        get: Callable[[str], Awaitable[Task]],
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self._dependants = dependants
        self._touch = touch
        self._get = get

    async def cancel(self, task_id: str) -> Task:
        etcd, keys = self._etcd, self._keys
        tkey = keys.task(task_id)
        for _ in range(WRITE_RETRIES):
            t = (await etcd.read_many([tkey]))[0]
            if t is None:
                raise TaskNotFound(task_id)
            rec = Record.loads(t.value)
            outcome = rules.cancelled(task_id, TaskState(rec.state), rec.owner)
            ops = apply_outcome(keys, rec, outcome, self._clock())
            ops.append(put(tkey, rec.dumps()))
            resp = await etcd.txn([mod_is(tkey, t.mod_revision)], ops)
            if resp.succeeded:
                ended = outcome.ends and rec.has_waiters
                await self._dependants.settle_many([task_id] if ended else [])
                self._touch()
                return await self._get(task_id)
        raise StoreError(f"task {task_id} kept changing; gave up after {WRITE_RETRIES} tries")

    async def retry(self, task_id: str) -> Task:
        etcd, keys = self._etcd, self._keys
        tkey = keys.task(task_id)
        for _ in range(WRITE_RETRIES):
            t = (await etcd.read_many([tkey]))[0]
            if t is None:
                raise TaskNotFound(task_id)
            rec = Record.loads(t.value)
            outcome = rules.retried(task_id, TaskState(rec.state))
            ops = apply_outcome(keys, rec, outcome, self._clock())
            ops.append(put(tkey, rec.dumps()))
            resp = await etcd.txn([mod_is(tkey, t.mod_revision)], ops)
            if resp.succeeded:
                self._touch()
                return await self._get(task_id)
        raise StoreError(f"task {task_id} kept changing; gave up after {WRITE_RETRIES} tries")

    async def purge_all(self) -> None:
        """Delete every task, expert and index under this store's prefix (benchmarks, tests).
        Live sessions end with it: their session keys are gone."""
        p, meta = self._keys.p, self._keys.k("meta")
        await self._etcd.txn(
            [],
            [delete(p, end=meta), delete(meta + b"\0", end=prefix_end(p))],
        )
        self._touch()

    async def compact_history(self, timeout: float = 600.0) -> int:
        """Compact etcd's history up to now (every key of the cluster, not only this prefix)
        and wait until it is done; returns the revision. A task store rewrites and deletes
        keys all the time, and etcd keeps every old revision until compacted: run etcd with
        ``--auto-compaction-retention``; this is for benchmarks and tools that start from a
        clean slate. Watches behind the compacted revision restart from now."""
        etcd = self._etcd
        resp = await etcd.range(self._keys.k("meta"))
        rev = int(resp.header.revision)
        req = rpc.CompactionRequest(revision=rev, physical=True)
        try:
            await etcd.call("a compaction", lambda: etcd.kv.Compact(req, timeout=timeout))
        except StoreError as exc:
            if "compacted" not in str(exc):  # already compacted to here by someone else: fine
                raise
        return rev
