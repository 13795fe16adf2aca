"""Reads for people and dashboards: get, list_tasks, stats, key_states, peek, backlog,
next_due."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from contend.domain.ids import check_id_prefix
from contend.domain.limits import KeyState
from contend.domain.scoring import TaskView
from contend.domain.task import OWNED_STATES, Capabilities, Requirements, Task, TaskState
from contend.errors import TaskNotFound
from contend.store._common import check_limit
from contend.store.etcd.candidates import Views, choose
from contend.store.etcd.keys import Keys, enc, micros, prefix_end, unenc
from contend.store.etcd.levels import Levels, any_kv
from contend.store.etcd.payloads import read_payloads
from contend.store.etcd.rates import rate_state
from contend.store.etcd.record import Record, index_json, task_of
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions, session_deadline
from contend.store.etcd.txn import get
from contend.store.port import Backlog, StoreStats

#: stats()'s cache: task key -> ((mod, create revision, version), queue, state, updated, run_at)
_Row = tuple[tuple[int, int, int], str, str, float, float]


class Inspection:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        clock: Callable[[], float],
        levels: Levels,
        sessions: Sessions,
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self._levels = levels
        self._sessions = sessions
        self._stat_cache: dict[bytes, _Row] = {}
        self._stat_rev = 0  # the lowest revision of the last stats() read

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        etcd, keys = self._etcd, self._keys
        t = (await etcd.read_many([keys.task(task_id)]))[0]
        if t is None:
            raise TaskNotFound(task_id)
        rec = Record.loads(t.value)
        deadline = (await self._deadlines([rec])).get(rec.id)
        ((args, result, checkpoint),) = await read_payloads(etcd, keys, [rec])
        return task_of(rec, args, result, checkpoint, history, deadline)

    async def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        queue: str | None = None,
        type: str | None = None,
        newest: bool = False,
        limit: int = 100,
    ) -> list[Task]:
        check_limit(limit)
        want = None if state is None else str(TaskState(state))
        return await self._tasks_where(
            lambda rec: (
                (want is None or rec.state == want)
                and (queue is None or rec.queue == queue)
                and (type is None or rec.type == type)
            ),
            limit,
            newest=newest,
        )

    async def dependants(self, task_id: str, *, limit: int = 100) -> list[Task]:
        """A scan: the ``w/`` edges name a task's waiters only until it ends."""
        check_limit(limit)
        return await self._tasks_where(lambda rec: task_id in rec.depends_on, limit)

    async def ids_with_prefix(self, prefix: str, *, limit: int = 10) -> list[str]:
        """One range read of the record keys ``t/{prefix}…``, keys only, at most *limit*
        (etcd returns them by key, which is by id: hex ids are not changed by ``enc``)."""
        check_id_prefix(prefix)
        check_limit(limit)
        if not limit:
            return []
        start = self._keys.task(prefix)
        resp = await self._etcd.range(start, prefix_end(start), limit=limit, keys_only=True)
        base = len(self._keys.k("t", ""))
        return [unenc(kv.key[base:].decode()) for kv in resp.kvs]

    async def key_states(self, keys: Collection[str]) -> dict[str, KeyState]:
        """What a claim reads of each key: its holder keys ``n/{limit key}/`` counted (one per
        task of it claimed or running) and its ``r/{limit key}``, two reads a key in one
        read-only Txn of one snapshot (``Etcd.reads``: pinned ranges on etcd 3.5.0-3.5.4),
        as many Txns as ``max_txn_ops`` needs (63 keys each at the default 128), at once."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        ops = [
            op
            for k in wanted
            for op in (
                get(self._keys.holders(k), prefix=True, count_only=True),
                get(self._keys.rate(k)),
            )
        ]
        step = self._etcd.max_ops // 2 * 2  # a key's two reads in the same snapshot
        parts = await asyncio.gather(
            *(self._etcd.reads(ops[i : i + step]) for i in range(0, len(ops), step))
        )
        got = [r for part in parts for r in part]
        out = {}
        for n, key in enumerate(wanted):
            held, rate = got[2 * n], got[2 * n + 1]
            state = rate_state(rate.kvs[0] if rate.kvs else None)
            if state is None:
                out[key] = KeyState(int(held.count))
            else:
                out[key] = KeyState(int(held.count), state.rate, state.tat)
        return out

    async def _tasks_where(
        self, keep: Callable[[Record], bool], limit: int, *, newest: bool = False
    ) -> list[Task]:
        """The first *limit* tasks by id (the last, *newest* first) whose record *keep*
        accepts, payloads read."""
        if not limit:
            return []
        recs = [
            rec
            for kv in await self._etcd.scan(self._keys.k("t", ""))
            if keep(rec := Record.loads(kv.value))
        ]
        recs.sort(key=lambda r: r.id, reverse=newest)
        recs = recs[:limit]
        data = await read_payloads(self._etcd, self._keys, recs)
        deadlines = await self._deadlines(recs)
        return [
            task_of(rec, args, result, checkpoint, False, deadlines.get(rec.id))
            for rec, (args, result, checkpoint) in zip(recs, data, strict=True)
        ]

    async def _deadlines(self, recs: Iterable[Record]) -> dict[str, float]:
        """Reported lease deadlines of owned tasks: their session's (last heartbeat + TTL, or
        when it was deregistered). etcd's TTL is the truth; this is its approximation."""
        owned = [r for r in recs if r.owner is not None and r.state in OWNED_STATES]
        names = sorted({r.owner for r in owned if r.owner is not None})
        kvs = await self._etcd.read_many([self._keys.k("e", enc(n)) for n in names])
        sessions: dict[tuple[str, str], float] = {}
        for n, kv in zip(names, kvs, strict=True):
            if kv is not None:
                d = json.loads(kv.value)
                sessions[(n, d["session"])] = session_deadline(d)
                for old, deadline in d.get("ended", {}).items():
                    sessions[(n, old)] = deadline
        out = {}
        for r in owned:
            assert r.owner is not None
            found = sessions.get((r.owner, r.session or ""))
            out[r.id] = found if found is not None else (r.lease_deadline or r.updated_at)
        return out

    async def stats(self) -> StoreStats:
        now = self._clock()
        counts: dict[str, dict[str, int]] = {}
        done: dict[str, int] = {}
        oldest: float | None = None
        for _, queue, state, updated_at, run_at in await self._stat_rows():
            q = counts.setdefault(queue, {})
            q[state] = q.get(state, 0) + 1
            if state == TaskState.SUCCEEDED and updated_at > now - 60:
                done[queue] = done.get(queue, 0) + 1
            elif state == TaskState.PENDING and run_at <= now:
                age = now - run_at
                oldest = age if oldest is None else max(oldest, age)
        experts = await self._sessions.experts()
        return StoreStats(now, counts, experts, sum(done.values()), oldest, done)

    async def _stat_rows(self) -> list[_Row]:
        """(revisions, queue, state, updated_at, run_at) of every task, for stats(). Polled
        often (progress displays, the benchmark) while few tasks change between two calls:
        the keys are read without values, and only the records whose revisions moved since
        the last call are read again; many moved records are read in one scan instead."""
        etcd = self._etcd
        prefix = self._keys.k("t", "")
        keys: list[Any] = []
        start, end, low = prefix, prefix_end(prefix), None
        while True:
            resp = await etcd.range(start, end, limit=5000, keys_only=True)
            low = resp.header.revision if low is None else min(low, resp.header.revision)
            keys.extend(resp.kvs)
            if not resp.more or not resp.kvs:
                break
            start = resp.kvs[-1].key + b"\0"
        cache = self._stat_cache
        if low is not None and low < self._stat_rev:  # another cluster behind the same URL
            cache.clear()
        self._stat_rev = max(self._stat_rev, low or 0)

        def row(kv: Any) -> _Row:
            rec = Record.loads(kv.value)
            revs = (kv.mod_revision, kv.create_revision, kv.version)
            return revs, rec.queue, rec.state, rec.updated_at, rec.run_at

        def revs(kv: Any) -> tuple[int, int, int]:
            return kv.mod_revision, kv.create_revision, kv.version

        stale = [kv.key for kv in keys if (r := cache.get(kv.key)) is None or r[0] != revs(kv)]
        fresh: dict[bytes, _Row] = {}
        if len(stale) > max(256, len(keys) // 4):
            for kv in await etcd.scan(prefix):
                fresh[kv.key] = row(kv)
        else:
            gone = set()
            for key, kv in zip(stale, await etcd.read_many(stale), strict=True):
                if kv is None:
                    gone.add(key)
                else:
                    fresh[key] = row(kv)
            for kv in keys:
                if kv.key not in fresh and kv.key not in gone:
                    fresh[kv.key] = cache[kv.key]
        self._stat_cache = fresh
        return list(fresh.values())

    async def peek(
        self,
        queues: Sequence[str],
        capabilities: Capabilities,
        limit: int,
        *,
        low_lane: int = 0,
        types: Collection[str] | None = None,
    ) -> list[TaskView]:
        check_limit(limit)
        if not queues or not limit:
            return []
        views: Views = {}  # no task record to read
        now = self._clock()
        ids = await choose(
            self._levels, queues, capabilities, limit, low_lane, now, views=views, types=types
        )
        out = []
        for tid in ids[:limit]:
            v = views[tid]
            if not isinstance(v, TaskView):  # what the priority index holds
                queue, priority, value = v
                d = index_json(value)
                created = float(value[: value.index(b" ")])
                v = TaskView(
                    tid, d["type"], queue, priority, Requirements.from_json(d["req"]), created
                )
            out.append(v)
        return out

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        now = self._clock()
        due_by = f"{micros(now) + 1:017d}".encode()

        async def level(prefix: bytes, floor: bytes) -> tuple[int, float | None]:
            if prefix + floor >= prefix + due_by:
                return 0, None
            # One read gives both: etcd counts the whole range whatever the limit.
            head = await self._etcd.range(prefix + floor, prefix + due_by, limit=1, keys_only=True)
            due = int(head.kvs[0].key[len(prefix) :][:17]) / 1_000_000 if head.kvs else None
            return int(head.count), due

        found = await asyncio.gather(*(level(*x) for x in await self._levels.every(queues)))
        dues = [due for _, due in found if due is not None]
        return Backlog(sum(n for n, _ in found), max(0.0, now - min(dues)) if dues else None)

    async def next_due(self, queues: Sequence[str], *, later: bool = False) -> float | None:
        async def level(prefix: bytes, floor: bytes) -> float | None:
            kvs, _ = await self._levels.read(prefix, prefix + floor, 1, 1, any_kv, b"\0first")
            return int(kvs[0].key[len(prefix) :][:17]) / 1_000_000 if kvs else None

        found = await asyncio.gather(*(level(*x) for x in await self._levels.every(queues)))
        return min((due for due in found if due is not None), default=None)
