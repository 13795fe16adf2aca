"""The SQLite store's facade: :class:`SQLiteStore`, the :class:`~contend.store.port.Store`
made of this package's parts. Each method hands its work to the module named for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from contend.domain.scoring import TaskView
from contend.domain.task import Capabilities, Task, TaskSpec, TaskState
from contend.errors import FencedOut
from contend.store.port import (
    Auction,
    Backlog,
    Claimed,
    Completion,
    ExpertInfo,
    ExpertRecord,
    Failure,
    Heartbeat,
    Promises,
    StoreStats,
    Submitted,
)
from contend.store.sqlite import (
    auctions,
    claims,
    housekeeping,
    inspection,
    management,
    owner_writes,
    sessions,
    submission,
)
from contend.store.sqlite.connection import Database
from contend.store.sqlite.schema import prepare
from contend.store.sqlite.url import parse_sqlite_url, sync_pragma


class SQLiteStore:
    """A store in one SQLite file. One connection per instance; create one per process."""

    promises = Promises()  # one write transaction per submission, whatever its size

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        busy_deadline: float = 30.0,
        idle_poll: float = 0.005,
    ) -> None:
        self.url = url
        self.path, opts = parse_sqlite_url(url)
        self._sync = sync_pragma(opts)
        self._db = Database(
            self.path, clock=clock, busy_deadline=busy_deadline, idle_poll=idle_poll
        )

    # -- connection ------------------------------------------------------------------------
    async def open(self) -> None:
        await self._db.open(lambda conn: prepare(conn, self.path, self._sync))

    async def close(self) -> None:
        await self._db.close()

    async def now(self) -> float:
        return self._db.clock()

    # -- submission and inspection ---------------------------------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        return await submission.submit(self._db, specs)

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        return await inspection.get(self._db, task_id, history=history)

    async def list_tasks(
        self, *, state: TaskState | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Task]:
        return await inspection.list_tasks(self._db, state=state, queue=queue, limit=limit)

    async def stats(self) -> StoreStats:
        return await inspection.stats(self._db)

    async def list_experts(self) -> list[ExpertRecord]:
        return await inspection.list_experts(self._db)

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        return await inspection.backlog(self._db, queues)

    async def next_due(self, queues: Sequence[str]) -> float | None:
        return await inspection.next_due(self._db, queues)

    # -- the claim protocol ----------------------------------------------------------------
    async def peek(
        self, queues: Sequence[str], capabilities: Capabilities, limit: int, *, low_lane: int = 0
    ) -> list[TaskView]:
        return await claims.peek(self._db, queues, capabilities, limit, low_lane=low_lane)

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
        return await claims.claim(
            self._db,
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
        return await claims.steal(
            self._db, thief, session, victim, queues, capabilities, limit=limit, lease_ttl=lease_ttl
        )

    async def bid(
        self, expert: str, session: str, task_id: str, score: float, window: float
    ) -> Auction:
        return await auctions.bid(self._db, expert, session, task_id, score, window)

    # -- owner writes ----------------------------------------------------------------------
    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        return await owner_writes.start(self._db, expert, items)

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        await owner_writes.checkpoint(self._db, expert, task_id, fence, state_json)

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        return await owner_writes.complete(self._db, expert, items)

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        return await owner_writes.fail(self._db, expert, items)

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        return await owner_writes.release(self._db, expert, items)

    # -- sessions --------------------------------------------------------------------------
    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        return await sessions.register_expert(self._db, info, lease_ttl)

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        return await sessions.renew(self._db, expert, session, lease_ttl, beat)

    async def deregister_expert(self, expert: str, session: str) -> None:
        await sessions.deregister_expert(self._db, expert, session)

    # -- housekeeping and management -------------------------------------------------------
    async def expire(self) -> int:
        return await housekeeping.expire(self._db)

    async def cancel(self, task_id: str) -> Task:
        return await management.cancel(self._db, task_id)

    async def retry(self, task_id: str) -> Task:
        return await management.retry(self._db, task_id)

    # -- wake-ups --------------------------------------------------------------------------
    async def wait_for_change(self, timeout: float) -> None:
        await self._db.wakeups.wait_for_change(self._db.conn, timeout)
