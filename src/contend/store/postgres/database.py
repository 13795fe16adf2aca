"""The connection pool, and running a piece of work on it with retries.

:class:`Database` is what every other module of the package is handed: it runs a function
on a pooled cursor (:meth:`Database.run`), fills the ``{s}`` (schema) and ``{now}`` (the
store's clock) holes of SQL text (:meth:`Database.sql`), and adds the injected clock's value to
a statement's parameters (:meth:`Database.params`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from contend.errors import ConfigError, SchemaError, StoreError, StoreUnavailable
from contend.store._cancel import cancels, check_wanted
from contend.store.postgres.floors import Shape
from contend.store.postgres.url import safe

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]
Pool = AsyncConnectionPool[AsyncConnection[TupleRow]]

#: psycopg turns a statement's ``%(name)s`` placeholders into ``$n`` on every execution when
#: its text is longer than 4,096 bytes, and remembers the shorter ones (psycopg#628: long
#: texts are mostly generated and seldom repeat). contend's are few and repeat: a claim's text
#: is about 5 KB, and converting it again took 0.16 ms of a 0.94 ms claim. The bound is raised
#: for the process; psycopg's cache of conversions stays at its 128 entries.
CACHED_STATEMENT_LENGTH = 64 * 1024


def _cache_long_statements() -> None:
    from psycopg import _queries  # private: checked by tests/integration/postgres

    if getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", CACHED_STATEMENT_LENGTH) < (
        CACHED_STATEMENT_LENGTH
    ):
        _queries.MAX_CACHED_STATEMENT_LENGTH = CACHED_STATEMENT_LENGTH


_cache_long_statements()

#: The longest wait between two attempts of the pool to replace a lost connection, seconds.
RECONNECT_MOST = 1.0


class _Attempt(AttemptWithBackoff):
    """psycopg_pool's back-off between attempts to replace a lost connection, started at 50
    ms instead of 1 s and held at RECONNECT_MOST instead of doubling on: after a server
    restart of 3.6 s the store's connections came back 7 s after the crash (attempts at 0, 1,
    3 and 7 s), and with them the experts' sessions, so the tasks of the crash waited out
    twice the outage. A connection refused costs the server next to nothing."""

    INITIAL_DELAY = 0.05

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_MOST * random.uniform(0.8, 1.0))


class _Pool(AsyncConnectionPool):
    """The pool, with :class:`_Attempt`'s back-off for the connections it replaces."""

    async def _add_connection(self, attempt: Any, growing: bool = False) -> None:
        attempt = attempt or _Attempt(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing=growing)


log = logging.getLogger("contend.store.postgres")

#: What a statement meets in a database whose contend schema is gone (dropped and created
#: again empty, or the schema dropped): a store that lost its schema, not a passing failure.
LOST_SCHEMA = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)

#: The store's "now" in every statement: the injected clock's value, else the database's.
NOW = "coalesce(%(now)s::float8, extract(epoch from now())::float8)"
#: The same, read when the statement runs: ``now()`` is the transaction's start, which in a
#: task's own transaction (``transactions.py``) may be long past.
#: The payload of a notification that a task may be claimable below a claim's floor: pending
#: again with the due time it had (given back, lapsed, its dependencies over, retried by
#: hand) or promoted by ageing.
LOWERED = "floor"
#: The payload of a notification that tasks ended and freed nothing (no limit's slot, no
#: dependant): it wakes those waiting for a result, not the idle experts.
ENDED = "end"

NOW_LIVE = "coalesce(%(now)s::float8, extract(epoch from clock_timestamp())::float8)"


class Database:
    """One schema of one PostgreSQL database, reached through a pool of connections."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        clock: Callable[[], float] | None,
        pgbouncer: bool,
        pool_size: int,
        retry_deadline: float,
        connect_timeout: float,
        idle_tx_timeout: float = 0.0,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self._s = f'"{schema}"'
        self.channel = f"contend_{schema}"
        self.clock = clock
        self.trim_cursor = 0  # retention: the last history seq checked against the cap
        self.trim_next = 0.0  # retention: when (time.monotonic()) histories are next checked
        self.fair_cursor: dict[str, str] = {}  # queue -> the fair key a fair claim ended at
        #: Claims may take the lean statement (``claims.claim``): none of central tasks, limit
        #: keys, fair share or auctions seen yet. Off for good once a claim finds one in use.
        self.lean = True
        #: tasks this instance submitted, until it has seen to the table's first statistics
        #: (``submission.first_statistics``); None once it has
        self.submitted: int | None = 0
        #: where lean claims' walks may start, per claim shape (``floors``)
        self.floors: dict[Hashable, Shape] = {}
        #: whether this instance hears the notices that a task may stand below a floor (its
        #: LISTEN connection is up)
        self.floors_heard = False
        #: False: every claim walks its queues whole (the contract suite's model wants the
        #: exact best task of every claim; floors may miss one for up to FULL_EVERY seconds)
        self.use_floors = True
        self.retry_deadline = retry_deadline
        self._pgbouncer = pgbouncer
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._idle_tx_ms = round(idle_tx_timeout * 1000)
        self._pool: Pool | None = None
        self._tx_pool: Pool | None = None  # tasks' own transactions, opened on first use
        self._tx_pool_lock = asyncio.Lock()
        self._texts: dict[Hashable, str] = {}

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    def connect_kwargs(self, dsn: str, *, store: bool = True) -> dict[str, Any]:
        """Connection options: *store* for the store's own pool (not tasks' transactions)."""
        given = psycopg.conninfo.conninfo_to_dict(dsn)
        kwargs: dict[str, Any] = {"autocommit": True}
        defaults = {
            "connect_timeout": str(max(1, round(self._connect_timeout))),
            "keepalives": "1",
            "keepalives_idle": "10",
            "keepalives_interval": "5",
            "keepalives_count": "3",
            "application_name": "contend",
        }
        if store and not self._pgbouncer:
            # No JIT for the store's own statements: a claim's plan over a large table costs
            # past jit_above_cost, and compiling it took 370 ms of a 2 ms claim. And one plan
            # per prepared statement: the server kept planning a claim with a low-lane slot
            # afresh (6.5 ms of planning for 2.9 ms of work), its generic plan being costed
            # above the custom ones; the generic plan runs it in 1.5 ms. (PgBouncer refuses
            # startup options: there the server's settings stand.) And a bound on a transaction
            # left open by a client that stopped (SIGSTOP, a paused VM, a debugger): the
            # server ends that session, and its row locks, which held every other expert's
            # renewal, expiry and hand-over, are freed (idle_tx_timeout, 5 s by default).
            options = "-c jit=off -c plan_cache_mode=force_generic_plan"
            if self._idle_tx_ms:
                options += f" -c idle_in_transaction_session_timeout={self._idle_tx_ms}"
            defaults["options"] = options
        kwargs.update({k: v for k, v in defaults.items() if k not in given})
        if self._pgbouncer:
            kwargs["prepare_threshold"] = None
        return kwargs

    async def open(self) -> None:
        unreachable = await self._probe()
        pool: Pool = _Pool(
            self.dsn,
            kwargs=self.connect_kwargs(self.dsn),
            min_size=min(2, self._pool_size),
            max_size=self._pool_size,
            open=False,
            timeout=self.retry_deadline,
            reconnect_timeout=self.retry_deadline,
            name=f"contend-{self.schema}",
        )
        try:
            await pool.open(wait=True, timeout=self.retry_deadline)
        except (PoolTimeout, psycopg.Error) as exc:
            await pool.close()
            raise StoreError(
                f"cannot connect to PostgreSQL at {safe(self.dsn)} within "
                f"{self.retry_deadline:.0f}s: {unreachable or exc}"
            ) from exc
        self._pool = pool

    async def _probe(self) -> str | None:
        """One connection before the pool: a refusal no retry can mend (no such database,
        role or host, a wrong password) is said at once with libpq's reason, instead of after
        the pool's retry deadline. A server that may come up (refused, starting) is left to the
        pool, which retries, said once here; returns why it could not connect then."""
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, **self.connect_kwargs(self.dsn))
        except psycopg.OperationalError as exc:
            reason = one_line(str(exc))
            if cannot_heal(reason):
                raise ConfigError(
                    f"cannot connect to PostgreSQL at {safe(self.dsn)}: {reason}"
                ) from exc
            log.warning(
                "PostgreSQL at %s is not reachable (%s); trying for up to %.0fs",
                safe(self.dsn),
                reason,
                self.retry_deadline,
            )
            return reason
        await conn.close()
        return None

    async def close(self) -> None:
        if self._tx_pool is not None:
            await self._tx_pool.close()
            self._tx_pool = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def tx_pool(self) -> Pool:
        """The pool of tasks' own transactions (``ctx.transaction()``), apart from the store's
        so that a task holding a connection for its block never delays a renewal; made on first
        use, with no connection kept open before one is asked for."""
        if self._pool is None:
            raise StoreError("the PostgreSQL store is not open (call await store.open())")
        async with self._tx_pool_lock:
            if self._tx_pool is None:
                pool: Pool = _Pool(
                    self.dsn,
                    kwargs=self.connect_kwargs(self.dsn, store=False),
                    min_size=0,
                    max_size=self._pool_size,
                    open=False,
                    timeout=self.retry_deadline,
                    reconnect_timeout=self.retry_deadline,
                    name=f"contend-{self.schema}-tasks",
                )
                await pool.open(wait=False)
                self._tx_pool = pool
            return self._tx_pool

    def sql(self, text: str, *, live: bool = False) -> str:
        """*text* with its ``{s}`` (the schema) and ``{now}`` holes filled; *live*: the time
        when the statement runs rather than when its transaction began."""
        return text.replace("{s}", self._s).replace("{now}", NOW_LIVE if live else NOW)

    def text(self, shape: Hashable, build: Callable[[], str]) -> str:
        """The statement of *shape*, built by *build* the first time (a claim's text is some
        5 KB made of many parts: building it and hashing a new string each call cost a claim
        tens of microseconds). The same object each time, so psycopg's cache of converted
        queries finds it by identity."""
        text = self._texts.get(shape)
        if text is None:
            text = self._texts[shape] = build()
        return text

    def params(self, **params: Any) -> dict[str, Any]:
        params["now"] = None if self.clock is None else float(self.clock())
        return params

    async def notify(self, cur: Cursor, *, lowered: bool = False) -> None:
        """Wake the listeners; *lowered*: a task may have become claimable below a claim's
        floor (``floors``), so each listener's next claim walks its queues whole."""
        await cur.execute("SELECT pg_notify(%s, %s)", (self.channel, LOWERED if lowered else ""))

    def floors_lowered(self) -> None:
        """A notice said a task may stand below the floors: the next claims walk whole."""
        for shape in self.floors.values():
            shape.full_at = -float("inf")

    async def now(self) -> float:
        if self.clock is not None:
            return self.clock()

        async def run(cur: Cursor) -> float:
            await cur.execute("SELECT extract(epoch from clock_timestamp())::float8")
            return float(one(await cur.fetchone())[0])

        return await self.run(run, tx=False)

    async def run(self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = True) -> T:
        """Run *fn* on a pooled connection (in a transaction when *tx*), retrying with back-off
        on connection loss, serialization failures and deadlocks; give up after the deadline.
        A call whose caller gave up (cancelled it) tries no more, even when the cancellation
        was swallowed on the way (``pool.check()`` does: see ``store._cancel``)."""
        if self._pool is None:
            raise StoreError("the PostgreSQL store is not open (call await store.open())")
        pool = self._pool
        deadline = time.monotonic() + self.retry_deadline
        pause = 0.05
        since = cancels()
        while True:
            check_wanted(since)
            try:
                async with pool.connection() as conn:
                    if tx:
                        async with conn.transaction(), conn.cursor() as cur:
                            return await fn(cur)
                    async with conn.cursor() as cur:
                        return await fn(cur)
            except (psycopg.OperationalError, PoolTimeout) as exc:
                if time.monotonic() + pause > deadline:
                    raise StoreUnavailable(
                        f"PostgreSQL at {safe(self.dsn)} failed for "
                        f"{self.retry_deadline:.0f}s: {exc}"
                    ) from exc
                log.warning("PostgreSQL operation failed (%s); retrying in %.2fs", exc, pause)
                if not isinstance(exc, psycopg.errors.TransactionRollback):
                    try:
                        await pool.check()  # drop the other broken connections now
                    except Exception as check_exc:  # fails too while the server is down
                        log.debug("pool check failed: %s", check_exc)
            except LOST_SCHEMA as exc:
                raise SchemaError(
                    f"schema {self.schema!r} of {safe(self.dsn)} lost its contend tables "
                    f"({exc}); nothing was written (was the database dropped or emptied?)"
                ) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL error: {exc}") from exc
            await asyncio.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, 1.0)


#: libpq's words for a connection refused for good: retrying would give the same answer.
PERMANENT = (
    "does not exist",  # the database or the role
    "failed to resolve host",
    "could not translate host name",
    "password authentication failed",
    "no pg_hba.conf entry",
    "no password supplied",
    "invalid connection option",
    "invalid sslmode",
)


def cannot_heal(reason: str) -> bool:
    return any(words in reason for words in PERMANENT)


def one_line(text: str) -> str:
    """libpq's multi-line message as one line (``FATAL:  x`` becomes ``FATAL: x``)."""
    return " ".join(" ".join(part.split()) for part in text.splitlines() if part.strip())


def one(row: T | None) -> T:
    if row is None:
        raise StoreError("PostgreSQL returned no row where one was expected")
    return row
