""":class:`PostgresStore`, the port's face: each operation is handed to the module that does it
(the package docstring lists them)."""

from __future__ import annotations

from collections.abc import Callable

from contend.domain.task import Task
from contend.store._common import bind
from contend.store.port import (
    CentralDispatch,
    ExpertInfo,
    Store,
)
from contend.store.postgres import (
    auctions,
    claims,
    dispatch,
    housekeeping,
    inspection,
    management,
    owner_writes,
    retention,
    schema,
    sessions,
    submission,
    transactions,
)
from contend.store.postgres.database import Database
from contend.store.postgres.url import TRUE, idle_tx_timeout, parse_postgres_url
from contend.store.postgres.wakeups import Wakeups


class PostgresStore:
    """A store in a PostgreSQL schema. One instance per process; it keeps a connection pool
    and one listener connection."""

    #: One transaction per submission, whatever its size; a task's own transaction on a
    #: connection of the same database (transactions.py).
    promises = submission.PROMISES

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
        create: bool = True,
    ) -> None:
        self.url = url
        self._create = create  # False: open an existing store only (read-only commands)
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
            idle_tx_timeout=idle_tx_timeout(opts, url),
        )
        self.channel = self._db.channel
        self._wakeups = Wakeups(self._db, listen_url=listen_url, poll_interval=poll_interval)
        db = self._db
        # The port, operation by operation, and the module that does each.
        self.submit = bind(submission.submit, db)  # submission.py
        self.get = bind(inspection.get, db)  # inspection.py
        self.list_tasks = bind(inspection.list_tasks, db)
        self.dependants = bind(inspection.dependants, db)
        self.ids_with_prefix = bind(inspection.ids_with_prefix, db)
        self.key_states = bind(inspection.key_states, db)
        self.stats = bind(inspection.stats, db)
        self.list_experts = bind(inspection.list_experts, db)
        self.backlog = bind(inspection.backlog, db)
        self.next_due = bind(inspection.next_due, db)
        self.peek = bind(claims.peek, db)  # claims.py
        self.claim = bind(claims.claim, db)
        self.steal = bind(claims.steal, db)
        self.bid = bind(auctions.bid, db)  # auctions.py
        self.start = bind(owner_writes.start, db)  # owner_writes.py
        self.checkpoint = bind(owner_writes.checkpoint, db)
        self.progress = bind(owner_writes.progress, db)
        self.complete = bind(owner_writes.complete, db)
        self.fail = bind(owner_writes.fail, db)
        self.release = bind(owner_writes.release, db)
        self._register_expert = bind(sessions.register_expert, db)  # sessions.py
        self.renew = bind(sessions.renew, db)
        self.deregister_expert = bind(sessions.deregister_expert, db)
        self.expire = bind(housekeeping.expire, db)  # housekeeping.py
        self.begin = bind(transactions.begin, db)  # transactions.py
        self.end_session = bind(housekeeping.end_session, db)
        self.lead = bind(dispatch.lead, db)  # dispatch.py
        self.assign = bind(dispatch.assign, db)
        self.central_backlog = bind(dispatch.central_backlog, db)

    # -- opening and closing ---------------------------------------------------------------

    async def open(self) -> None:
        if self._db.is_open:
            return
        self._wakeups.opening()
        await self._db.open()
        try:
            await schema.prepare(self._db, create=self._create)
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

    # -- management ------------------------------------------------------------------------
    async def cancel(self, task_id: str) -> Task:
        await management.cancel(self._db, task_id)
        return await self.get(task_id)

    async def retry(self, task_id: str) -> Task:
        await management.retry(self._db, task_id)
        return await self.get(task_id)

    async def prune(self, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
        return await retention.prune(self._db, before, limit, keep_events=keep_events)

    async def purge_all(self) -> None:
        """Delete every task, its history and every expert in this schema (benchmarks use it
        to start from an empty store). Not part of the port; there is no undo."""
        await management.purge_all(self._db)

    # -- wake-ups --------------------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """True while the LISTEN connection is up and listening (wake-ups are pushed, not
        polled): from the first wait or expert registration on, so that a process that only
        submits receives no notifications."""
        return self._wakeups.listening

    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        """Start a session (sessions.py); the store listens from now on, as it does from its
        first wait: an expert's claims use what the notifications say (a task given back
        below a claim's floor), whether or not it has waited yet."""
        await self._wakeups.listen()
        return await self._register_expert(info, lease_ttl)

    async def wait_for_change(self, timeout: float) -> None:
        """Return on a notification (or a missed one), else after *timeout* seconds; while the
        LISTEN connection is down (or disabled), after at most the poll interval."""
        await self._wakeups.wait_for_change(timeout)

    async def wait_for_work(self, timeout: float) -> None:
        """As :meth:`wait_for_change`, but a task that ended and freed nothing (no limit's
        slot, no dependant) wakes no one waiting here (its notification says ``end``)."""
        await self._wakeups.wait_for_work(timeout)


def _is_a_store(store: PostgresStore) -> Store:
    return store  # mypy checks here that PostgresStore implements the whole port


def _dispatches(store: PostgresStore) -> CentralDispatch:
    return store  # and that it implements central dispatch (promises.central_dispatch)
