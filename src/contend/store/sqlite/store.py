"""The SQLite store's facade: :class:`SQLiteStore`, the :class:`~contend.store.port.Store`
made of this package's parts. Each method hands its work to the module named for it."""

from __future__ import annotations

import time
from collections.abc import Callable

from contend.store._common import bind
from contend.store.port import (
    CentralDispatch,
    Promises,
    Store,
)
from contend.store.sqlite import (
    auctions,
    claims,
    dispatch,
    housekeeping,
    inspection,
    management,
    owner_writes,
    retention,
    sessions,
    submission,
)
from contend.store.sqlite.clock import HostClock
from contend.store.sqlite.connection import Database
from contend.store.sqlite.schema import prepare
from contend.store.sqlite.transactions import Transactions
from contend.store.sqlite.url import parse_sqlite_url, sync_pragma


class SQLiteStore:
    """A store in one SQLite file. One connection per instance; create one per process.

    ``create=False`` opens an existing store only: a file that does not exist or is empty
    raises SchemaError and is left as it is (the read-only commands open stores so)."""

    #: One write transaction per submission, whatever its size. A task's transaction holds the
    #: write lock from begin to end (transactions.py).
    promises = Promises(
        transactions=True,
        exclusive_transactions=True,
        concurrency_limits=True,
        rate_limits=True,
        fair_share=True,
        central_dispatch=True,
    )

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] | None = None,
        busy_deadline: float = 30.0,
        idle_poll: float = 0.005,
        create: bool = True,
    ) -> None:
        self.url = url
        self.path, opts = parse_sqlite_url(url)
        self._sync = sync_pragma(opts)
        self._create = create  # False: open an existing store only (read-only commands)
        # None: the host's boot-time clock on the wall clock's scale (clock.py)
        self._host_clock = HostClock() if clock is None else None
        self._db = Database(
            self.path,
            clock=clock or self._host_clock or time.time,
            busy_deadline=busy_deadline,
            idle_poll=idle_poll,
            sync=self._sync,
        )
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
        self.lead = bind(dispatch.lead, db)  # dispatch.py
        self.assign = bind(dispatch.assign, db)
        self.central_backlog = bind(dispatch.central_backlog, db)
        self.start = bind(owner_writes.start, db)  # owner_writes.py
        self.checkpoint = bind(owner_writes.checkpoint, db)
        self.progress = bind(owner_writes.progress, db)
        self.complete = bind(owner_writes.complete, db)
        self.fail = bind(owner_writes.fail, db)
        self.release = bind(owner_writes.release, db)
        self.register_expert = bind(sessions.register_expert, db)  # sessions.py
        self.renew = bind(sessions.renew, db)
        self.deregister_expert = bind(sessions.deregister_expert, db)
        self.expire = bind(housekeeping.expire, db)  # housekeeping.py
        self.end_session = bind(housekeeping.end_session, db)
        self.cancel = bind(management.cancel, db)  # management.py
        self.retry = bind(management.retry, db)
        self.prune = bind(retention.prune, db)  # retention.py
        self._transactions = Transactions(db, self._sync)  # transactions.py
        self.begin = self._transactions.begin

    # -- connection and the parts that are not a function of the database -------------
    async def open(self) -> None:
        create = self._create
        await self._db.open(
            lambda conn: prepare(conn, self.path, self._sync, create=create), create=create
        )
        host = self._host_clock
        if host is not None:
            await self._db.retry(lambda: self._anchor(host, write=create))

    def _anchor(self, host: HostClock, *, write: bool) -> None:
        if host.adopt(self._db.conn):
            return
        if not write:
            host.anchor(self._db.conn, write=False)
            return
        with self._db.write() as conn:  # the first open of this boot
            host.anchor(conn, write=True)

    async def close(self) -> None:
        self._transactions.close()
        await self._db.close()

    async def now(self) -> float:
        return self._db.clock()

    async def wait_for_change(self, timeout: float) -> None:
        await self._db.wakeups.wait_for_change(self._db.conn, timeout)

    async def wait_for_work(self, timeout: float) -> None:
        """As :meth:`wait_for_change`: another process's commit is seen, not what it did."""
        await self._db.wakeups.wait_for_change(self._db.conn, timeout)


def _is_a_store(store: SQLiteStore) -> Store:
    return store  # mypy checks here that SQLiteStore implements the whole port


def _dispatches(store: SQLiteStore) -> CentralDispatch:
    return store  # and that it implements central dispatch (promises.central_dispatch)
