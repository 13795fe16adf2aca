"""EtcdStore: the Store port on etcd, composed of the parts that do the work."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from contend.domain.scoring import TaskView
from contend.domain.task import Capabilities, Task, TaskSpec, TaskState
from contend.errors import FencedOut, SchemaError, StoreError
from contend.store.etcd.auctions import Auctions
from contend.store.etcd.claims import Claims
from contend.store.etcd.config import Options
from contend.store.etcd.dependants import Dependants
from contend.store.etcd.housekeeping import Housekeeping
from contend.store.etcd.inspection import Inspection
from contend.store.etcd.keys import Keys
from contend.store.etcd.levels import Levels
from contend.store.etcd.manage import Management
from contend.store.etcd.owner import Owned, OwnerWrites
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions
from contend.store.etcd.submit import Submitter
from contend.store.etcd.txn import absent, get, put
from contend.store.etcd.watch import Changes
from contend.store.port import (
    Auction,
    Backlog,
    Claimed,
    Completion,
    ExpertInfo,
    ExpertRecord,
    Failure,
    Heartbeat,
    StoreStats,
    Submitted,
)

#: 4: v/ holds floors, no o/ index; 3: records are arrays, q/ by priority (docs/etcd.md).
SCHEMA_VERSION = 4


class EtcdStore:
    """A store in an etcd v3 cluster, reached over gRPC. One instance per process.

    ``EtcdStore(url, clock=..., timeout=..., max_txn_ops=..., compact_after=...)``: the
    options may also be given in the URL's query (docs/etcd.md). Each method hands its work
    to the part that holds it; they share one connection (``_etcd``) and key layout."""

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        timeout: float | None = None,
        max_txn_ops: int | None = None,
        compact_after: float | None = None,
    ) -> None:
        self.url = url
        o = Options.of(url, timeout=timeout, max_txn_ops=max_txn_ops, compact_after=compact_after)
        self.options = o
        self.host, self.port = o.host, o.port
        self._clock = clock
        self._keys = keys = Keys(o.prefix)
        self._etcd = etcd = Etcd(o.host, o.port, o.timeout, o.max_txn_ops, keys.k("t", ""))
        self._changes = Changes(etcd, keys)
        touch = self._changes.touch
        self._sessions = sessions = Sessions(etcd, keys, clock)
        self._levels = levels = Levels(etcd, keys)
        self._dependants = dependants = Dependants(etcd, keys, clock)
        owned: Owned = {}
        self._owner = OwnerWrites(etcd, keys, clock, owned, dependants, touch)
        self._claims = Claims(etcd, keys, clock, sessions, levels, owned)
        self._submitter = Submitter(etcd, keys, clock, touch)
        self._inspection = Inspection(etcd, keys, clock, levels, sessions)
        self._auctions = Auctions(etcd, keys, clock, sessions)
        self._housekeeping = Housekeeping(
            etcd, keys, clock, o.compact_after, sessions, dependants, self._auctions, touch
        )
        self._manage = Management(etcd, keys, clock, dependants, touch, self._inspection.get)

    # -- connection --------------------------------------------------------------------------
    async def open(self) -> None:
        if self._etcd.channel is not None:
            return
        self._etcd.connect()
        try:
            await self._check_schema()
        except BaseException:
            await self.close()
            raise

    async def _check_schema(self) -> None:
        meta = self._keys.k("meta")
        p = self._keys.p
        for _ in range(3):
            # One snapshot: contend writes the meta key before any other key and never deletes
            # it, so keys without it belong to something else, even with contend processes
            # opening the same new prefix at once.
            resp = await self._etcd.txn(
                [], [get(meta), get(p, prefix=True, limit=1, keys_only=True)]
            )
            found, some = (r.response_range.kvs for r in resp.responses)
            if found:
                self._check_meta(found[0].value)
                return
            if some:
                raise SchemaError(
                    f"etcd prefix {p.decode()!r} at {self.host}:{self.port} holds keys that "
                    "are not a contend store; pick another prefix (etcd://host:port/prefix)"
                )
            want = json.dumps({"schema": SCHEMA_VERSION}).encode()
            if (await self._etcd.txn([absent(meta)], [put(meta, want)])).succeeded:
                return
        raise StoreError(f"could not set up the contend store at {self._etcd.where()}")

    def _check_meta(self, value: bytes) -> None:
        p = self._keys.p
        try:
            version = json.loads(value)["schema"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SchemaError(
                f"etcd prefix {p.decode()!r} is not a contend store (bad meta key)"
            ) from exc
        if version != SCHEMA_VERSION:
            raise SchemaError(
                f"etcd prefix {p.decode()!r} has contend schema version {version}; "
                f"this contend understands version {SCHEMA_VERSION}"
            )

    async def close(self) -> None:
        await self._changes.close()
        self._sessions.close()
        await self._etcd.close()

    async def now(self) -> float:
        return self._clock()

    # -- submission and inspection (submit.py, inspection.py) ---------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        return await self._submitter.submit(specs)

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        return await self._inspection.get(task_id, history=history)

    async def list_tasks(
        self, *, state: TaskState | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Task]:
        return await self._inspection.list_tasks(state=state, queue=queue, limit=limit)

    async def stats(self) -> StoreStats:
        return await self._inspection.stats()

    async def list_experts(self) -> list[ExpertRecord]:
        return await self._sessions.experts()

    async def peek(
        self, queues: Sequence[str], capabilities: Capabilities, limit: int, *, low_lane: int = 0
    ) -> list[TaskView]:
        return await self._inspection.peek(queues, capabilities, limit, low_lane=low_lane)

    async def next_due(self, queues: Sequence[str]) -> float | None:
        return await self._inspection.next_due(queues)

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        return await self._inspection.backlog(queues)

    # -- claims (claims.py) ------------------------------------------------------------------
    async def claim(
        self,
        expert: str,
        session: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
        task_ids: Sequence[str] | None = None,
        start: bool = True,
        low_lane: int = 0,
    ) -> list[Claimed]:
        return await self._claims.claim(
            expert,
            session,
            queues,
            capabilities,
            limit=limit,
            lease_ttl=lease_ttl,
            task_ids=task_ids,
            start=start,
            low_lane=low_lane,
        )

    async def steal(
        self,
        thief: str,
        session: str,
        victim: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
    ) -> list[Claimed]:
        return await self._claims.steal(
            thief, session, victim, queues, capabilities, limit=limit, lease_ttl=lease_ttl
        )

    # -- owner writes (owner.py) -------------------------------------------------------------
    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        return await self._owner.start(expert, items)

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        await self._owner.checkpoint(expert, task_id, fence, state_json)

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        return await self._owner.complete(expert, items)

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        return await self._owner.fail(expert, items)

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        return await self._owner.release(expert, items)

    # -- sessions (sessions.py) --------------------------------------------------------------
    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        return await self._sessions.register(info, lease_ttl)

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        return await self._sessions.renew(expert, session, lease_ttl, beat)

    async def deregister_expert(self, expert: str, session: str) -> None:
        await self._sessions.deregister(expert, session)

    async def end_session(self, expert: str) -> bool:
        """Fault injection (tests, drills): revoke the etcd lease of *expert*'s live session,
        as if it had run out. Its claims vanish at once. Returns False when it had none."""
        return await self._sessions.end(expert)

    # -- housekeeping, auctions, management, wake-ups ----------------------------------------
    async def expire(self) -> int:
        return await self._housekeeping.expire()

    async def bid(
        self, expert: str, session: str, task_id: str, score: float, window: float
    ) -> Auction:
        return await self._auctions.bid(expert, session, task_id, score, window)

    async def cancel(self, task_id: str) -> Task:
        return await self._manage.cancel(task_id)

    async def retry(self, task_id: str) -> Task:
        return await self._manage.retry(task_id)

    async def purge_all(self) -> None:
        """Delete every task, expert and index under this store's prefix (benchmarks, tests).
        Live sessions end with it: their session keys are gone."""
        await self._manage.purge_all()

    async def compact_history(self, timeout: float = 600.0) -> int:
        """Compact etcd's history up to now (every key of the cluster, not only this prefix)
        and wait until it is done; returns the revision (see manage.py)."""
        return await self._manage.compact_history(timeout)

    async def wait_for_change(self, timeout: float) -> None:
        await self._changes.wait(timeout)
