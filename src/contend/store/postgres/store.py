""":class:`PostgresStore`, the port's face: each operation is handed to the module that does it
(the package docstring lists them)."""

from __future__ import annotations

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
    StoreStats,
    Submitted,
)
from contend.store.postgres import (
    auctions,
    claims,
    housekeeping,
    inspection,
    management,
    owner_writes,
    schema,
    sessions,
    submission,
)
from contend.store.postgres.database import Database
from contend.store.postgres.url import TRUE, parse_postgres_url
from contend.store.postgres.wakeups import Wakeups


class PostgresStore:
    """A store in a PostgreSQL schema. One instance per process; it keeps a connection pool
    and one listener connection."""

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] | None = None,
        pool_size: int | None = None,
        retry_deadline: float = 15.0,
        connect_timeout: float = 5.0,
        poll_interval: float = 0.25,
        listen_url: str | None = None,
    ) -> None:
        self.url = url
        dsn, opts = parse_postgres_url(url)
        self.schema = opts["schema"]
        pgbouncer = opts.get("pgbouncer", "false").lower() in TRUE
        listen_default = "false" if pgbouncer else "true"
        listen_url = listen_url or opts.get("listen_url")
        self._listen = listen_url is not None or opts.get("listen", listen_default).lower() in TRUE
        self._db = Database(
            dsn,
            self.schema,
            clock=clock,
            pgbouncer=pgbouncer,
            pool_size=pool_size or int(opts.get("pool_size", "10")),
            retry_deadline=retry_deadline,
            connect_timeout=connect_timeout,
        )
        self.channel = self._db.channel
        self._wakeups = Wakeups(self._db, listen_url=listen_url, poll_interval=poll_interval)

    # -- opening and closing ---------------------------------------------------------------
    async def open(self) -> None:
        if self._db.is_open:
            return
        self._wakeups.opening()
        await self._db.open()
        try:
            await schema.prepare(self._db)
            if self._listen:
                await self._wakeups.start()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await self._wakeups.stop()
        await self._db.close()

    async def migrate(self) -> list[int]:
        """Create the schema or bring it up to this contend's version; returns the versions
        applied. Safe to run from several processes at once (an advisory lock orders them).

        It needs no :meth:`open` (which refuses an old schema): ``contend migrate`` builds the
        store from its URL and calls this alone."""
        if not self._db.is_open:
            await self._db.open()
            try:
                return await schema.migrate(self._db)
            finally:
                await self.close()
        return await schema.migrate(self._db)

    async def now(self) -> float:
        return await self._db.now()

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

    # -- the claim path --------------------------------------------------------------------
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
            self._db,
            thief,
            session,
            victim,
            queues,
            capabilities,
            limit=limit,
            lease_ttl=lease_ttl,
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
        await management.cancel(self._db, task_id)
        return await self.get(task_id)

    async def retry(self, task_id: str) -> Task:
        await management.retry(self._db, task_id)
        return await self.get(task_id)

    async def purge_all(self) -> None:
        """Delete every task, its history and every expert in this schema (benchmarks use it
        to start from an empty store). Not part of the port; there is no undo."""
        await management.purge_all(self._db)

    # -- wake-ups --------------------------------------------------------------------------
    @property
    def listening(self) -> bool:
        """True while the LISTEN connection is up (wake-ups are pushed, not polled)."""
        return self._wakeups.listening

    async def wait_for_change(self, timeout: float) -> None:
        """Return on a notification (or a missed one), else after *timeout* seconds; while the
        LISTEN connection is down (or disabled), after at most the poll interval."""
        await self._wakeups.wait_for_change(timeout)
