"""The PostgreSQL store: experts on many hosts share one database.

* A claim is one statement: ``UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED LIMIT n)``, with
  requirement filtering in SQL (jsonb containment for tags, a resource comparison), so two
  claimers never wait on each other and never take the same task.
* Every owner write is one fenced ``UPDATE … FROM unnest(…) WHERE fence = … AND owner = … AND
  state IN (…) AND lease_deadline >= now`` per batch; items it did not touch are reported as
  :class:`~contend.errors.FencedOut` with the reason read back in the same transaction.
* Times are the database's clock (``now()``, the transaction's start) as float8 epoch seconds,
  unless a *clock* is injected (tests), whose value is then passed to every statement instead.
* Wake-ups: writes that make work claimable ``NOTIFY`` a channel; a dedicated connection
  ``LISTEN``s to it. If that connection drops it reconnects with back-off, and meanwhile
  :meth:`PostgresStore.wait_for_change` returns after a short poll interval.
* Connection errors (a server restart, a killed backend) are retried with back-off for a
  bounded time, then raised as :class:`~contend.errors.StoreError` with the cause.
* The schema is versioned (``contend_schema_version``); :meth:`PostgresStore.open` creates it in
  an empty database and refuses a schema of another version: run ``contend migrate``.

URL options (query string, removed before connecting): ``schema`` (default ``contend``),
``listen`` (``on``/``off``), ``listen_url`` (a percent-encoded URL for the LISTEN connection,
to bypass a transaction-mode PgBouncer), ``pgbouncer`` (``true``: no prepared statements and
no LISTEN unless ``listen_url`` is given), ``pool_size``. See ``docs/postgres.md``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.conninfo
import psycopg.errors
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from contend.domain.scoring import TaskView
from contend.domain.task import (
    JSON,
    Capabilities,
    Requirements,
    Task,
    TaskEvent,
    TaskSpec,
    TaskState,
    aged_priority,
    can_move,
    next_promotion,
)
from contend.errors import (
    ConfigError,
    ExpertConflict,
    FencedOut,
    InvalidTransition,
    LeaseLost,
    SchemaError,
    StoreError,
    TaskNotFound,
)
from contend.store._common import (
    check_batch_dependencies,
    check_bid,
    check_limit,
    check_retry_delay,
    check_ttl,
    initial_state,
    rank_bids,
)
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
from contend.store.postgres.migrations import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE

__all__ = ["SCHEMA_VERSION", "PostgresStore", "parse_postgres_url"]

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]

log = logging.getLogger("contend.store.postgres")

#: The store's "now" in every statement: the injected clock's value, else the database's.
NOW = "coalesce(%(now)s::float8, extract(epoch from now())::float8)"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
_OWNED = ("claimed", "running")
_TERMINAL = frozenset({"succeeded", "failed", "dead", "cancelled"})
_TERMINAL_BAD = frozenset({"failed", "dead", "cancelled"})
_OPTIONS = {"schema", "listen", "listen_url", "pgbouncer", "pool_size"}
_TRUE, _FALSE = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}

# submit's unnest arrays: name -> element type
_SUBMIT_COLUMNS = {
    "id": "text",
    "type": "text",
    "queue": "text",
    "state": "text",
    "priority": "int",
    "args": "text",
    "kwargs": "text",
    "key": "text",
    "req": "text",
    "max_attempts": "int",
    "delay": "float8",
    "timeout": "float8",
    "deps": "text",
    "deps_left": "int",
    "error": "text",
    "promote_in": "float8",
}

TASK_COLUMNS = (
    "id, type, queue, state, priority, args, kwargs, key, requirements, attempts, max_attempts, "
    "fence, owner, lease_deadline, run_at, created_at, updated_at, timeout, result, error, "
    "checkpoint, depends_on"
)

# The requirement filter: tags a subset of the expert's, every resource need within its amount.
FITS = (
    "(requirements IS NULL OR ("
    "coalesce(requirements->'tags', '[]'::jsonb) <@ %(tags)s::jsonb "
    "AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(coalesce(requirements->'resources', "
    "'{}'::jsonb)) AS need(name, amount) "
    "WHERE coalesce((%(resources)s::jsonb->>need.name)::float8, 0) < need.amount::float8)))"
)


def parse_postgres_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a store URL into the libpq URL and contend's own options (validated)."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"malformed PostgreSQL URL {url!r}: {exc}") from exc
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"not a PostgreSQL URL: {url!r}")
    opts = {k: v for k, v in query if k in _OPTIONS}
    rest = [(k, v) for k, v in query if k not in _OPTIONS]
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigError(f"malformed PostgreSQL URL {url!r}: {exc}") from exc
    schema = opts.setdefault("schema", "contend")
    if not _IDENT.match(schema):
        raise ConfigError(
            f"PostgreSQL URL {url!r}: schema {schema!r} must be letters, digits and _ "
            "(at most 41 characters, not starting with a digit)"
        )
    for flag in ("listen", "pgbouncer"):
        if flag in opts and opts[flag].lower() not in _TRUE | _FALSE:
            raise ConfigError(f"PostgreSQL URL {url!r}: {flag} must be true or false")
    if "pool_size" in opts and not (opts["pool_size"].isdigit() and int(opts["pool_size"]) > 0):
        raise ConfigError(f"PostgreSQL URL {url!r}: pool_size must be a positive integer")
    if "listen_url" in opts:
        listen_parts = urlsplit(opts["listen_url"])
        if listen_parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"PostgreSQL URL {url!r}: listen_url must be a postgresql:// URL")
    return dsn, opts


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
        self._dsn, opts = parse_postgres_url(url)
        self.schema = opts["schema"]
        self._s = f'"{self.schema}"'
        self.channel = f"contend_{self.schema}"
        self._clock = clock
        self._pgbouncer = opts.get("pgbouncer", "false").lower() in _TRUE
        listen_default = "false" if self._pgbouncer else "true"
        self._listen_url = listen_url or opts.get("listen_url")
        self._listen = (
            self._listen_url is not None or opts.get("listen", listen_default).lower() in _TRUE
        )
        self._pool_size = pool_size or int(opts.get("pool_size", "10"))
        self._retry_deadline = retry_deadline
        self._connect_timeout = connect_timeout
        self._poll_interval = poll_interval
        self._pool: AsyncConnectionPool[AsyncConnection[TupleRow]] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listening = False
        self._closing = False
        self._listener_conn: AsyncConnection[TupleRow] | None = None
        self._changed = asyncio.Event()
        self._version = 0
        self._seen = 0

    # -- connection ------------------------------------------------------------------------
    def _connect_kwargs(self, dsn: str) -> dict[str, Any]:
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
        kwargs.update({k: v for k, v in defaults.items() if k not in given})
        if self._pgbouncer:
            kwargs["prepare_threshold"] = None
        return kwargs

    async def _connect_pool(self) -> AsyncConnectionPool[AsyncConnection[TupleRow]]:
        pool: AsyncConnectionPool[AsyncConnection[TupleRow]] = AsyncConnectionPool(
            self._dsn,
            kwargs=self._connect_kwargs(self._dsn),
            min_size=min(2, self._pool_size),
            max_size=self._pool_size,
            open=False,
            timeout=self._retry_deadline,
            reconnect_timeout=self._retry_deadline,
            name=f"contend-{self.schema}",
        )
        try:
            await pool.open(wait=True, timeout=self._retry_deadline)
        except (PoolTimeout, psycopg.Error) as exc:
            await pool.close()
            raise StoreError(
                f"cannot connect to PostgreSQL at {_safe(self._dsn)} within "
                f"{self._retry_deadline:.0f}s: {exc}"
            ) from exc
        return pool

    async def open(self) -> None:
        if self._pool is not None:
            return
        self._closing = False
        self._pool = await self._connect_pool()
        try:
            await self._prepare()
            if self._listen:
                await self._start_listener()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._closing = True
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.wait([self._listener], timeout=self._retry_deadline)
            self._listener = None
        if self._listener_conn is not None:
            await self._listener_conn.close()
            self._listener_conn = None
        self._listening = False
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def now(self) -> float:
        if self._clock is not None:
            return self._clock()

        async def run(cur: Cursor) -> float:
            await cur.execute("SELECT extract(epoch from clock_timestamp())::float8")
            return float(_one(await cur.fetchone())[0])

        return await self._run(run, tx=False)

    def _sql(self, text: str) -> str:
        return text.replace("{s}", self._s).replace("{now}", NOW)

    def _p(self, **params: Any) -> dict[str, Any]:
        params["now"] = None if self._clock is None else float(self._clock())
        return params

    async def _run(self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = True) -> T:
        """Run *fn* on a pooled connection (in a transaction when *tx*), retrying with back-off
        on connection loss, serialization failures and deadlocks; give up after the deadline."""
        if self._pool is None:
            raise StoreError("the PostgreSQL store is not open (call await store.open())")
        pool = self._pool
        deadline = time.monotonic() + self._retry_deadline
        pause = 0.05
        while True:
            try:
                async with pool.connection() as conn:
                    if tx:
                        async with conn.transaction(), conn.cursor() as cur:
                            return await fn(cur)
                    async with conn.cursor() as cur:
                        return await fn(cur)
            except (psycopg.OperationalError, PoolTimeout) as exc:
                if time.monotonic() + pause > deadline:
                    raise StoreError(
                        f"PostgreSQL at {_safe(self._dsn)} failed for "
                        f"{self._retry_deadline:.0f}s: {exc}"
                    ) from exc
                log.warning("PostgreSQL operation failed (%s); retrying in %.2fs", exc, pause)
                if not isinstance(exc, psycopg.errors.TransactionRollback):
                    try:
                        await pool.check()  # drop the other broken connections now
                    except Exception as check_exc:  # fails too while the server is down
                        log.debug("pool check failed: %s", check_exc)
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL error: {exc}") from exc
            await asyncio.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, 1.0)

    # -- schema ----------------------------------------------------------------------------
    async def _schema_version(self, cur: Cursor) -> int | None:
        """The schema's version; None when the schema is absent or empty. Raises SchemaError
        when it holds tables that are not a contend store's."""
        await cur.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (self.schema,),
        )
        tables = {r[0] for r in await cur.fetchall()}
        if not tables:
            return None
        if "contend_schema_version" not in tables:
            raise SchemaError(
                f"schema {self.schema!r} of {_safe(self._dsn)} holds tables but is not a "
                "contend store; choose another with ?schema=name in the store URL"
            )
        await cur.execute(self._sql("SELECT max(version) FROM {s}.contend_schema_version"))
        version = _one(await cur.fetchone())[0]
        return int(version or 0)

    async def _prepare(self) -> None:
        async def check(cur: Cursor) -> int | None:
            return await self._schema_version(cur)

        version = await self._run(check)
        if version is None:
            await self._migrate()
            return
        self._check_version(version)

    def _check_version(self, version: int) -> None:
        if version < SCHEMA_VERSION:
            raise SchemaError(
                f"schema {self.schema!r} of {_safe(self._dsn)} is at version {version}; this "
                f"contend needs version {SCHEMA_VERSION}: run contend migrate"
            )
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"schema {self.schema!r} of {_safe(self._dsn)} is at version {version}, newer "
                f"than this contend understands ({SCHEMA_VERSION}): upgrade contend"
            )

    async def migrate(self) -> list[int]:
        """Create the schema or bring it up to this contend's version; returns the versions
        applied. Safe to run from several processes at once (an advisory lock orders them).

        It needs no :meth:`open` (which refuses an old schema): ``contend migrate`` builds the
        store from its URL and calls this alone."""
        if self._pool is None:
            self._pool = await self._connect_pool()
            try:
                return await self._migrate()
            finally:
                await self.close()
        return await self._migrate()

    async def _migrate(self) -> list[int]:

        async def run(cur: Cursor) -> list[int]:
            await cur.execute(
                "SELECT pg_advisory_xact_lock(hashtext('contend.migrate.' || %s))", (self.schema,)
            )
            current = await self._schema_version(cur)
            await cur.execute(self._sql("CREATE SCHEMA IF NOT EXISTS {s}"))
            await cur.execute(self._sql(VERSION_TABLE))
            current = current or 0
            if current > SCHEMA_VERSION:
                self._check_version(current)
            applied = []
            for step in MIGRATIONS:
                if step.version <= current:
                    continue
                for statement in step.statements:
                    await cur.execute(self._sql(statement))
                await cur.execute(
                    self._sql(
                        "INSERT INTO {s}.contend_schema_version (version, description) "
                        "VALUES (%s, %s)"
                    ),
                    (step.version, step.description),
                )
                applied.append(step.version)
            return applied

        return await self._run(run)

    # -- submission and inspection ---------------------------------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        if not specs:
            return []

        # A batch with no keys and no dependencies reads nothing first: its one statement is
        # atomic on its own, without the round trips of an explicit transaction.
        simple = all(s.key is None and not s.depends_on for s in specs)

        async def run(cur: Cursor) -> list[Submitted]:
            known: set[str] = set()
            if not simple:
                await cur.execute(
                    self._sql("SELECT id FROM {s}.tasks WHERE id = ANY(%s)"),
                    ([s.id for s in specs],),
                )
                known = {r[0] for r in await cur.fetchall()}
            keys = [s.key for s in specs if s.key is not None]
            existing: dict[str, str] = {}
            if keys:
                await cur.execute(
                    self._sql("SELECT key, id FROM {s}.tasks WHERE key = ANY(%s)"), (keys,)
                )
                existing.update((r[0], r[1]) for r in await cur.fetchall())
            fresh: list[TaskSpec] = []
            out: list[Submitted] = []
            for spec in specs:
                if spec.id in known:  # the same spec sent again (a lost reply): keep the task
                    out.append(Submitted(spec.id, False))
                    continue
                if spec.key is not None and spec.key in existing:
                    out.append(Submitted(existing[spec.key], False))
                    continue
                if spec.key is not None:
                    existing[spec.key] = spec.id
                fresh.append(spec)
                out.append(Submitted(spec.id, True))
            deps = sorted({d for s in fresh for d in s.depends_on})
            states: dict[str, str] = {}
            if deps:
                # FOR SHARE: a dependency cannot finish (and miss our task_deps rows) until we commit.
                await cur.execute(
                    self._sql(
                        "SELECT id, state FROM {s}.tasks WHERE id = ANY(%s) ORDER BY id FOR SHARE"
                    ),
                    (deps,),
                )
                states = {r[0]: r[1] for r in await cur.fetchall()}
            check_batch_dependencies(fresh, lambda ids: {i for i in ids if i in states})
            if not fresh:
                return out
            cols: dict[str, list[Any]] = {name: [] for name in _SUBMIT_COLUMNS}
            dep_rows: list[tuple[str, str]] = []
            # Dependencies before their dependents, so that a task depending on one made dead
            # in this same batch (its own dependency had failed) is dead too, not left waiting
            # for a task that will never finish.
            for spec in _dependencies_first(fresh):
                left = [d for d in spec.depends_on if states.get(d) not in _TERMINAL]
                failed = [d for d in spec.depends_on if states.get(d) in _TERMINAL_BAD]
                state = initial_state(spec, len(left))
                error = None
                if failed:
                    state = TaskState.DEAD
                    error = _error_json(
                        "DependencyFailed", f"dependency {failed[0]} did not succeed"
                    )
                row = (
                    spec.id,
                    spec.type,
                    spec.queue,
                    str(state),
                    spec.priority,
                    spec.args_json,
                    spec.kwargs_json,
                    spec.key,
                    _req_json(spec.requirements),
                    spec.max_attempts,
                    spec.delay,
                    spec.timeout,
                    json.dumps(list(spec.depends_on)) if spec.depends_on else None,
                    len(left),
                    error,
                    next_promotion(spec.priority, spec.priority, 0.0),  # after creation
                )
                for name, value in zip(_SUBMIT_COLUMNS, row, strict=True):
                    cols[name].append(value)
                states[spec.id] = str(state)
                dep_rows.extend((d, spec.id) for d in left)
            await cur.execute(
                self._submit_sql,
                self._p(
                    **cols,
                    dep_ids=[d for d, _ in dep_rows],
                    dep_tasks=[t for _, t in dep_rows],
                    channel=self.channel,
                ),
            )
            inserted = {r[0] for r in await cur.fetchall()}
            # an id already there (only a simple batch gets this far with one): sent again
            return [Submitted(o.id, o.created and o.id in inserted) for o in out]

        for attempt in range(3):
            try:
                return await self._run(run, tx=not simple)
            except StoreError as exc:
                cause = exc.__cause__
                if not isinstance(cause, psycopg.errors.UniqueViolation):
                    raise
                if cause.diag.constraint_name == "tasks_key_key" and attempt < 2:
                    continue  # another submitter inserted the same key: read it this time
                raise StoreError(f"submission refused by the database: {cause}") from cause
        raise AssertionError("unreachable")

    @property
    def _submit_sql(self) -> str:
        # one statement: the tasks, their dependency edges and the notification
        types = ", ".join(f"%({n})s::{t}[]" for n, t in _SUBMIT_COLUMNS.items())
        return self._sql(
            "WITH ins AS ("
            "  INSERT INTO {s}.tasks (id, type, queue, state, priority, args, kwargs, key,"
            "   requirements, max_attempts, run_at, created_at, updated_at, timeout, depends_on,"
            "   deps_left, error, eff_priority, promote_at)"
            "  SELECT r.id, r.type, r.queue, r.state, r.priority, r.args, r.kwargs, r.key,"
            "   r.req::jsonb, r.max_attempts, {now} + r.delay, {now}, {now}, r.timeout,"
            "   CASE WHEN r.deps IS NULL THEN NULL"
            "    ELSE ARRAY(SELECT jsonb_array_elements_text(r.deps::jsonb)) END,"
            "   r.deps_left, r.error, r.priority, {now} + r.promote_in"
            f"  FROM unnest({types}) AS r({', '.join(_SUBMIT_COLUMNS)})"
            "  ON CONFLICT (id) DO NOTHING RETURNING id"
            "), deps AS ("
            "  INSERT INTO {s}.task_deps (dep_id, task_id)"
            "  SELECT * FROM unnest(%(dep_ids)s::text[], %(dep_tasks)s::text[])"
            "  ON CONFLICT DO NOTHING"
            ") SELECT id, pg_notify(%(channel)s, '') FROM ins"
        )

    async def _notify(self, cur: Cursor) -> None:
        await cur.execute("SELECT pg_notify(%s, '')", (self.channel,))

    def _row_to_task(self, r: Sequence[Any], history: tuple[TaskEvent, ...] = ()) -> Task:
        return Task(
            id=r[0],
            type=r[1],
            queue=r[2],
            state=TaskState(r[3]),
            priority=r[4],
            args=json.loads(r[5]),
            kwargs=json.loads(r[6]),
            key=r[7],
            requirements=Requirements.from_json(r[8]),
            attempts=r[9],
            max_attempts=r[10],
            fence=r[11],
            owner=r[12],
            lease_deadline=r[13],
            run_at=r[14],
            created_at=r[15],
            updated_at=r[16],
            timeout=r[17],
            result=_load(r[18]),
            error=_load(r[19]),
            checkpoint=_load(r[20]),
            depends_on=tuple(r[21] or ()),
            history=history,
        )

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        async def run(cur: Cursor) -> Task:
            await cur.execute(
                self._sql(f"SELECT {TASK_COLUMNS} FROM {{s}}.tasks WHERE id = %s"), (task_id,)
            )
            row = await cur.fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            events: tuple[TaskEvent, ...] = ()
            if history:
                await cur.execute(
                    self._sql(
                        "SELECT at, event, fence, expert, detail FROM {s}.task_events "
                        "WHERE task_id = %s ORDER BY seq"
                    ),
                    (task_id,),
                )
                events = tuple(TaskEvent(*e) for e in await cur.fetchall())
            return self._row_to_task(row, events)

        return await self._run(run, tx=history)

    async def list_tasks(
        self, *, state: TaskState | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Task]:
        check_limit(limit)
        where, params = [], []
        if state is not None:
            where.append("state = %s")
            params.append(str(TaskState(state)))
        if queue is not None:
            where.append("queue = %s")
            params.append(queue)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = self._sql(f"SELECT {TASK_COLUMNS} FROM {{s}}.tasks {clause} ORDER BY id LIMIT %s")

        async def run(cur: Cursor) -> list[Task]:
            await cur.execute(sql, (*params, limit))
            return [self._row_to_task(r) for r in await cur.fetchall()]

        return await self._run(run, tx=False)

    async def stats(self) -> StoreStats:
        async def run(cur: Cursor) -> tuple[float, dict[str, dict[str, int]], int, float | None]:
            await cur.execute(
                self._sql(
                    "SELECT {now}, "
                    "(SELECT count(*) FROM {s}.tasks WHERE state = 'succeeded' "
                    " AND updated_at > {now} - 60), "
                    "(SELECT min(run_at) FROM {s}.tasks WHERE state = 'pending' "
                    " AND run_at <= {now})"
                ),
                self._p(),
            )
            now, done, oldest = _one(await cur.fetchone())
            await cur.execute(
                self._sql("SELECT queue, state, count(*) FROM {s}.tasks GROUP BY queue, state")
            )
            counts: dict[str, dict[str, int]] = {}
            for queue, state, n in await cur.fetchall():
                counts.setdefault(queue, {})[state] = int(n)
            return now, counts, int(done), (None if oldest is None else now - oldest)

        now, counts, done, oldest = await self._run(run)
        return StoreStats(now, counts, await self.list_experts(), done, oldest)

    async def list_experts(self) -> list[ExpertRecord]:
        async def run(cur: Cursor) -> list[ExpertRecord]:
            await cur.execute(
                self._sql(
                    "SELECT id, session, info, lease_deadline, heartbeat_at, started_at, load, "
                    "claim_attempts, claims_won, tasks_done, lease_deadline >= {now}, metrics "
                    "FROM {s}.experts ORDER BY id"
                ),
                self._p(),
            )
            return [
                ExpertRecord(
                    info=ExpertInfo.from_json_text(r[2]),
                    session=r[1],
                    alive=r[10],
                    load=r[6],
                    lease_deadline=r[3],
                    heartbeat_at=r[4],
                    started_at=r[5],
                    claim_attempts=r[7],
                    claims_won=r[8],
                    tasks_done=r[9],
                    metrics=json.loads(r[11]),
                )
                for r in await cur.fetchall()
            ]

        return await self._run(run, tx=False)

    # -- the claim protocol ----------------------------------------------------------------
    @staticmethod
    def _caps(capabilities: Capabilities) -> dict[str, str]:
        return {
            "tags": json.dumps(sorted(capabilities.tags)),
            "resources": json.dumps(dict(capabilities.resources)),
        }

    @staticmethod
    def _candidates(*, lock: bool, queues: int, only_ids: bool = False) -> str:
        """CTEs ``best`` and ``oldest``: the claimable tasks by effective priority (``%(best)s``
        of them), and those due the longest (``%(lane)s``, the low-priority lane). With *lock*
        each takes its rows ``FOR UPDATE SKIP LOCKED`` (a claim; the rows must be locked where
        they are limited, or a concurrent claimer's rows would use up the limit), and only
        while the ``live`` CTE has the session.

        One arm per queue (parameters ``q0``, ``q1``, …): with ``queue = ANY(array)`` the
        planner cannot walk the index in claim order and sorts every pending task instead."""
        tail = " FOR UPDATE SKIP LOCKED" if lock else ""
        ctes = []
        for kind, order, limit in (
            ("best", "eff_priority DESC, run_at, id", "%(best)s"),
            ("oldest", "run_at, id", "%(lane)s"),
        ):
            arms = []
            for n in range(queues):
                where = (
                    ("EXISTS (SELECT 1 FROM live) AND " if lock else "")
                    + f"state = 'pending' AND queue = %(q{n})s AND run_at <= {{now}} "
                    + ("AND id = ANY(%(ids)s) " if only_ids else "")
                    + f"AND {FITS}"
                )
                ctes.append(
                    f"{kind}_{n} AS (SELECT id, eff_priority, run_at FROM {{s}}.tasks"
                    f" WHERE {where} ORDER BY {order} LIMIT {limit}{tail})"
                )
                arms.append(f"SELECT * FROM {kind}_{n}")
            ctes.append(
                f"{kind} AS (SELECT id FROM ({' UNION ALL '.join(arms)}) u"
                f" ORDER BY {order} LIMIT {limit})"
            )
        ctes.append("picked AS (SELECT id FROM best UNION SELECT id FROM oldest)")
        return ", ".join(ctes)

    @staticmethod
    def _queues(queues: Sequence[str]) -> dict[str, str]:
        return {f"q{n}": q for n, q in enumerate(dict.fromkeys(queues))}

    async def peek(
        self, queues: Sequence[str], capabilities: Capabilities, limit: int, *, low_lane: int = 0
    ) -> list[TaskView]:
        check_limit(limit)
        if not queues or not limit:
            return []
        lane = min(check_limit(low_lane), limit)
        sql = self._sql(
            f"WITH {self._candidates(lock=False, queues=len(set(queues)))}"
            " SELECT t.id, t.type, t.queue, t.priority, t.requirements, t.created_at"
            " FROM {s}.tasks t JOIN picked USING (id)"
            " ORDER BY t.eff_priority DESC, t.run_at, t.id"
        )

        async def run(cur: Cursor) -> list[TaskView]:
            await cur.execute(
                sql,
                self._p(
                    **self._queues(queues),
                    best=limit - lane,
                    lane=lane,
                    **self._caps(capabilities),
                ),
            )
            return [
                TaskView(r[0], r[1], r[2], r[3], Requirements.from_json(r[4]), r[5])
                for r in await cur.fetchall()
            ]

        return await self._run(run, tx=False)

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
        check_limit(limit)
        ttl = check_ttl(lease_ttl)
        ids = list(dict.fromkeys(task_ids)) if task_ids is not None else None
        # named tasks: the best of them, no low lane
        lane = min(check_limit(low_lane), limit) if ids is None else 0
        order = "eff_priority DESC, run_at, id"
        sql = self._sql(
            "WITH live AS ("
            "  SELECT 1 FROM {s}.experts WHERE id = %(expert)s AND session = %(session)s"
            "   AND lease_deadline >= {now} FOR SHARE"
            f"), {self._candidates(lock=True, queues=max(1, len(set(queues))), only_ids=ids is not None)}"
            ", claimed AS ("
            "  UPDATE {s}.tasks t SET state = %(state)s, owner = %(expert)s, fence = t.fence + 1,"
            "   attempts = t.attempts + 1, lease_deadline = {now} + %(ttl)s, updated_at = {now}"
            "  FROM picked WHERE t.id = picked.id"
            "  RETURNING t.id, t.type, t.queue, t.args, t.kwargs, t.fence, t.attempts,"
            "   t.max_attempts, t.checkpoint, t.timeout, t.lease_deadline, t.priority, t.run_at,"
            "   t.eff_priority"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
            "  SELECT id, {now}, 'claimed', fence, %(expert)s FROM claimed"
            f") SELECT * FROM claimed ORDER BY {order}"
        )

        async def run(cur: Cursor) -> list[Claimed]:
            if not queues or not limit or (ids is not None and not ids):
                await self._check_session(cur, expert, session)
                return []
            # One statement, atomic on its own: the session check (holding the expert row
            # shared, so that it cannot be replaced meanwhile), the pick and the update.
            await cur.execute(
                sql,
                self._p(
                    **self._queues(queues),
                    ids=ids,
                    best=limit - lane,
                    lane=lane,
                    state="running" if start else "claimed",
                    expert=expert,
                    session=session,
                    ttl=ttl,
                    **self._caps(capabilities),
                ),
            )
            rows = await cur.fetchall()
            if not rows:  # nothing claimable, or a session that is not live: which?
                await self._check_session(cur, expert, session)
            return [_claimed(r) for r in rows]

        return await self._run(run, tx=False)

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
        check_limit(limit)
        ttl = check_ttl(lease_ttl)
        sql = self._sql(
            "WITH live AS ("
            "  SELECT 1 FROM {s}.experts WHERE id = %(thief)s AND session = %(session)s"
            "   AND lease_deadline >= {now} FOR SHARE"
            "), loot AS ("
            "  SELECT id FROM {s}.tasks"
            "  WHERE EXISTS (SELECT 1 FROM live)"
            "   AND owner = %(victim)s AND state = 'claimed' AND lease_deadline >= {now}"
            f"   AND queue = ANY(%(queues)s) AND {FITS}"
            "  ORDER BY eff_priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
            "), stolen AS ("
            # a fenced transfer: the victim's start() of these is refused; no attempt counted
            "  UPDATE {s}.tasks t SET state = 'running', owner = %(thief)s,"
            "   fence = t.fence + 1, lease_deadline = {now} + %(ttl)s, updated_at = {now}"
            "  FROM loot WHERE t.id = loot.id"
            "  RETURNING t.id, t.type, t.queue, t.args, t.kwargs, t.fence, t.attempts,"
            "   t.max_attempts, t.checkpoint, t.timeout, t.lease_deadline, t.priority, t.run_at,"
            "   t.eff_priority"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
            "  SELECT id, {now}, 'stolen', fence, %(thief)s, %(detail)s FROM stolen"
            ") SELECT * FROM stolen ORDER BY eff_priority DESC, run_at, id"
        )

        async def run(cur: Cursor) -> list[Claimed]:
            if not queues or not limit:
                await self._check_session(cur, thief, session)
                return []
            await cur.execute(
                sql,
                self._p(
                    thief=thief,
                    session=session,
                    victim=victim,
                    queues=list(queues),
                    limit=limit,
                    ttl=ttl,
                    detail=f"from {victim}",
                    **self._caps(capabilities),
                ),
            )
            rows = await cur.fetchall()
            if not rows:
                await self._check_session(cur, thief, session)
            return [_claimed(r) for r in rows]

        return await self._run(run, tx=False)

    async def _check_session(self, cur: Cursor, expert: str, session: str) -> None:
        """Raise LeaseLost unless *session* is *expert*'s live session."""
        await cur.execute(
            self._sql(
                "SELECT 1 FROM {s}.experts WHERE id = %(expert)s AND session = %(session)s "
                "AND lease_deadline >= {now}"
            ),
            self._p(expert=expert, session=session),
        )
        if await cur.fetchone() is None:
            raise LeaseLost(f"expert {expert}: session {session} is not live")

    async def _refusals(
        self,
        cur: Cursor,
        expert: str,
        items: Sequence[tuple[str, int]],
        landed: Iterable[str],
        states: tuple[str, ...],
        earlier: Sequence[str] = (),
    ) -> list[FencedOut | None]:
        """Per item: None when the fenced write landed, else why it was refused (read back in
        the same transaction). A task named twice in one batch lands once.

        *earlier* names the history events this write leaves; it is given when the write is
        being retried after a lost connection, whose first try may have committed although
        its reply never came. An item refused now whose event, by this expert at this fence,
        is already in the history landed then: it is reported as landed, not fenced out (only
        the owner of a fence can write at that fence, so the event is this write's own)."""
        todo = {tid: 1 for tid in landed}
        out: list[FencedOut | None] = []
        found: dict[str, Sequence[Any]] = {}
        done_before: set[tuple[str, int]] = set()
        if len(items) > len(todo):
            ids = [tid for tid, _ in items]
            await cur.execute(
                self._sql(
                    "SELECT id, fence, owner, state, lease_deadline, lease_deadline >= {now}, "
                    "(SELECT e.lease_deadline >= {now} FROM {s}.experts e "
                    " WHERE e.id = %(expert)s) "
                    "FROM {s}.tasks WHERE id = ANY(%(ids)s)"
                ),
                self._p(ids=ids, expert=expert),
            )
            found = {r[0]: r for r in await cur.fetchall()}
            if earlier:
                await cur.execute(
                    self._sql(
                        "SELECT task_id, fence FROM {s}.task_events WHERE task_id = ANY(%s) "
                        "AND expert = %s AND event = ANY(%s)"
                    ),
                    (ids, expert, list(earlier)),
                )
                done_before = {(r[0], r[1]) for r in await cur.fetchall()}
        for tid, fence in items:
            if todo.get(tid):
                todo[tid] = 0
                out.append(None)
                continue
            if (tid, fence) in done_before:
                out.append(None)
                continue
            r = found.get(tid)
            if r is None:
                out.append(FencedOut(tid, fence, "no such task"))
            elif r[1] != fence:
                out.append(FencedOut(tid, fence, f"the task is at fence {r[1]}"))
            elif r[2] != expert:
                out.append(FencedOut(tid, fence, f"{expert} does not own it (owner: {r[2]})"))
            elif r[3] not in states:
                out.append(FencedOut(tid, fence, f"the task is {r[3]}"))
            elif r[4] is None or not r[5]:
                out.append(FencedOut(tid, fence, "the lease lapsed"))
            elif not r[6]:
                out.append(FencedOut(tid, fence, f"the lease of expert {expert} lapsed"))
            else:
                out.append(FencedOut(tid, fence, "the task changed during the write"))
        return out

    # The fenced condition shared by every owner write (``i`` is the batch, ``t`` the task).
    _FENCED = (
        "t.id = i.id AND t.fence = i.fence AND t.owner = %(expert)s "
        "AND t.state = ANY(%(states)s) AND t.lease_deadline >= {now} "
        "AND EXISTS (SELECT 1 FROM {s}.experts e WHERE e.id = %(expert)s "
        "AND e.lease_deadline >= {now})"
    )

    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        if not items:
            return []
        sql = self._sql(
            "WITH done AS ("
            "  UPDATE {s}.tasks t SET state = 'running', updated_at = {now}"
            "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[]) AS i(id, fence)"
            f"  WHERE {self._FENCED} RETURNING t.id, t.fence"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
            "  SELECT id, {now}, 'started', fence, %(expert)s FROM done"
            ") SELECT id FROM done"
        )

        tries = 0

        async def run(cur: Cursor) -> list[FencedOut | None]:
            nonlocal tries
            tries += 1
            await cur.execute(sql, self._batch(expert, items, ("claimed",)))
            landed = [r[0] for r in await cur.fetchall()]
            earlier = ("started",) if tries > 1 else ()
            return await self._refusals(cur, expert, items, landed, ("claimed",), earlier)

        return await self._run(run, tx=False)

    def _batch(
        self, expert: str, items: Sequence[tuple[str, int]], states: tuple[str, ...], **more: Any
    ) -> dict[str, Any]:
        return self._p(
            expert=expert,
            states=list(states),
            ids=[tid for tid, _ in items],
            fences=[fence for _, fence in items],
            **more,
        )

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        ttl = check_ttl(lease_ttl)

        async def run(cur: Cursor) -> dict[str, int]:
            await cur.execute(
                self._sql(
                    "UPDATE {s}.experts SET lease_deadline = {now} + %(ttl)s, "
                    "heartbeat_at = {now}, load = %(load)s, claim_attempts = %(attempts)s, "
                    "claims_won = %(won)s, tasks_done = %(done)s, metrics = %(metrics)s "
                    "WHERE id = %(expert)s AND session = %(session)s "
                    "AND lease_deadline >= {now} RETURNING 1"
                ),
                self._p(
                    ttl=ttl,
                    load=beat.load,
                    attempts=beat.claim_attempts,
                    won=beat.claims_won,
                    done=beat.tasks_done,
                    metrics=json.dumps(dict(beat.metrics)),
                    expert=expert,
                    session=session,
                ),
            )
            if await cur.fetchone() is None:
                raise LeaseLost(f"expert {expert}: session {session} is not live")
            await cur.execute(
                self._sql(
                    "UPDATE {s}.tasks SET lease_deadline = {now} + %(ttl)s "
                    "WHERE owner = %(expert)s AND state IN ('claimed', 'running') "
                    "AND lease_deadline >= {now} RETURNING id, fence"
                ),
                self._p(ttl=ttl, expert=expert),
            )
            return {r[0]: r[1] for r in await cur.fetchall()}

        return await self._run(run)

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        sql = self._sql(
            "UPDATE {s}.tasks t SET checkpoint = %(state)s, updated_at = {now} "
            "FROM unnest(%(ids)s::text[], %(fences)s::bigint[]) AS i(id, fence) "
            f"WHERE {self._FENCED} RETURNING t.id"
        )
        items = [(task_id, fence)]

        async def run(cur: Cursor) -> FencedOut | None:
            await cur.execute(sql, self._batch(expert, items, _OWNED, state=state_json))
            landed = [r[0] for r in await cur.fetchall()]
            (res,) = await self._refusals(cur, expert, items, landed, _OWNED)
            return res

        res = await self._run(run, tx=False)
        if res is not None:
            raise res

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        if not items:
            return []
        pairs = [(i.task_id, i.fence) for i in items]
        sql = self._sql(
            "WITH done AS ("
            "  UPDATE {s}.tasks t SET state = 'succeeded', result = i.result, owner = NULL,"
            "   lease_deadline = NULL, updated_at = {now}"
            "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[], %(results)s::text[])"
            "   AS i(id, fence, result)"
            f"  WHERE {self._FENCED} RETURNING t.id, t.fence"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
            "  SELECT id, {now}, 'succeeded', fence, %(expert)s FROM done"
            ") SELECT id FROM done"
        )

        tries = 0

        async def run(cur: Cursor) -> list[FencedOut | None]:
            nonlocal tries
            tries += 1
            await cur.execute(
                sql, self._batch(expert, pairs, _OWNED, results=[i.result_json for i in items])
            )
            landed = [r[0] for r in await cur.fetchall()]
            if landed:
                # A statement of its own, so that it sees a dependent whose submission
                # committed while the UPDATE above waited for the dependency's row lock.
                await self._settle_dependents(cur, [(tid, "succeeded") for tid in landed])
                await self._notify(cur)  # wakes result() waiters, and experts if dependents woke
            earlier = ("succeeded",) if tries > 1 else ()
            return await self._refusals(cur, expert, pairs, landed, _OWNED, earlier)

        return await self._run(run)

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        for item in items:
            check_retry_delay(item.retry_delay)
        if not items:
            return []
        pairs = [(i.task_id, i.fence) for i in items]
        retry = "i.delay IS NOT NULL AND t.attempts < t.max_attempts"
        sql = self._sql(
            "WITH done AS ("
            "  UPDATE {s}.tasks t SET"
            f"   state = CASE WHEN {retry} THEN 'pending' ELSE i.final END,"
            f"   run_at = CASE WHEN {retry} THEN {{now}} + i.delay ELSE t.run_at END,"
            "   error = i.error, owner = NULL, lease_deadline = NULL, updated_at = {now}"
            "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[], %(errors)s::text[],"
            "   %(delays)s::float8[], %(finals)s::text[], %(details)s::text[])"
            "   AS i(id, fence, error, delay, final, detail)"
            f"  WHERE {self._FENCED}"
            "  RETURNING t.id, t.fence, t.state,"
            "   CASE WHEN t.state = 'pending' THEN i.detail END AS detail"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
            "  SELECT id, {now}, CASE WHEN state = 'pending' THEN 'retry' ELSE state END,"
            "   fence, %(expert)s, detail FROM done"
            ") SELECT id, state FROM done"
        )

        tries = 0

        async def run(cur: Cursor) -> list[FencedOut | None]:
            nonlocal tries
            tries += 1
            await cur.execute(
                sql,
                self._batch(
                    expert,
                    pairs,
                    _OWNED,
                    errors=[i.error_json for i in items],
                    delays=[i.retry_delay for i in items],
                    finals=[
                        str(i.final_state if i.retry_delay is None else TaskState.DEAD)
                        for i in items
                    ],
                    details=[
                        None if i.retry_delay is None else f"in {i.retry_delay:.3f}s" for i in items
                    ],
                ),
            )
            rows = await cur.fetchall()
            settled = [(r[0], r[1]) for r in rows if r[1] != "pending"]
            if settled:
                await self._settle_dependents(cur, settled)
            if rows:
                await self._notify(cur)
            # not "cancelled": cancel records the owner it fenced out at the same fence
            earlier = ("retry", "failed", "dead") if tries > 1 else ()
            landed = [r[0] for r in rows]
            return await self._refusals(cur, expert, pairs, landed, _OWNED, earlier)

        return await self._run(run)

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        if not items:
            return []
        sql = self._sql(
            "WITH done AS ("
            "  UPDATE {s}.tasks t SET state = 'pending', owner = NULL, lease_deadline = NULL,"
            "   attempts = greatest(0, t.attempts - 1), updated_at = {now}"
            "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[]) AS i(id, fence)"
            f"  WHERE {self._FENCED} RETURNING t.id, t.fence"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
            "  SELECT id, {now}, 'released', fence, %(expert)s FROM done"
            ") SELECT id, pg_notify(%(channel)s, '') FROM done"
        )

        tries = 0

        async def run(cur: Cursor) -> list[FencedOut | None]:
            nonlocal tries
            tries += 1
            await cur.execute(sql, self._batch(expert, items, _OWNED, channel=self.channel))
            landed = [r[0] for r in await cur.fetchall()]
            earlier = ("released",) if tries > 1 else ()
            return await self._refusals(cur, expert, items, landed, _OWNED, earlier)

        return await self._run(run, tx=False)

    async def expire(self) -> int:
        lost = (
            "jsonb_build_object('type', 'LeaseExpired', 'message', "
            "'expert ' || coalesce(l.owner, '?') || ' lost its lease on the last attempt')::text"
        )
        sql = self._sql(
            "WITH lapsed AS ("
            "  SELECT id, owner FROM {s}.tasks"
            "  WHERE state IN ('claimed', 'running') AND lease_deadline < {now}"
            "  FOR UPDATE SKIP LOCKED"
            "), moved AS ("
            "  UPDATE {s}.tasks t SET"
            "   state = CASE WHEN t.attempts < t.max_attempts THEN 'pending' ELSE 'dead' END,"
            f"   error = CASE WHEN t.attempts < t.max_attempts THEN t.error ELSE {lost} END,"
            "   owner = NULL, lease_deadline = NULL, updated_at = {now}"
            "  FROM lapsed l WHERE t.id = l.id"
            "  RETURNING t.id, t.state, t.fence, l.owner"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
            "  SELECT id, {now}, 'expired', fence, owner FROM moved"
            ") SELECT id, state FROM moved"
        )

        async def run(cur: Cursor) -> int:
            await cur.execute(sql, self._p())
            rows = await cur.fetchall()
            dead = [(r[0], r[1]) for r in rows if r[1] == "dead"]
            if dead:
                await self._settle_dependents(cur, dead)
            await self._age(cur)  # after the lapse: returned tasks catch up on their ageing too
            await cur.execute(
                self._sql("DELETE FROM {s}.experts WHERE lease_deadline < {now} - 3600"), self._p()
            )
            # auctions and bids of tasks that are no longer pending
            await cur.execute(
                self._sql(
                    "WITH done AS ("
                    "  DELETE FROM {s}.auctions a USING {s}.tasks t"
                    "  WHERE t.id = a.task_id AND t.state <> 'pending' RETURNING a.task_id"
                    ") DELETE FROM {s}.bids WHERE task_id IN (SELECT task_id FROM done)"
                )
            )
            if rows:
                await self._notify(cur)
            return len(rows)

        return await self._run(run)

    async def _age(self, cur: Cursor) -> None:
        """Ageing: raise the effective priority of pending tasks whose next step is due
        (computed here with the domain's functions, so every backend rounds alike)."""
        await cur.execute(
            self._sql(
                "SELECT {now}, id, priority, created_at FROM {s}.tasks "
                "WHERE state = 'pending' AND promote_at <= {now} LIMIT 5000 "
                "FOR UPDATE SKIP LOCKED"
            ),
            self._p(),
        )
        due = await cur.fetchall()
        if not due:
            return
        ids, aged, promote = [], [], []
        for now, tid, priority, created in due:
            step = aged_priority(priority, now - created)
            ids.append(tid)
            aged.append(step)
            promote.append(next_promotion(priority, step, created))
        await cur.execute(
            self._sql(
                "UPDATE {s}.tasks t SET eff_priority = u.aged, promote_at = u.promote "
                "FROM unnest(%s::text[], %s::int[], %s::float8[]) AS u(id, aged, promote) "
                "WHERE t.id = u.id"
            ),
            (ids, aged, promote),
        )

    async def _settle_dependents(self, cur: Cursor, done: list[tuple[str, str]]) -> None:
        """Tell the waiting dependents of tasks that just finished: one fewer dependency left
        (pending when none is left), or dead when a dependency did not succeed."""
        todo = list(done)
        woke = False
        while todo:
            ok = [tid for tid, state in todo if state == "succeeded"]
            bad = {tid: state for tid, state in todo if state != "succeeded"}
            todo = []
            if ok:
                await cur.execute(
                    self._sql(
                        "WITH gone AS ("
                        "  DELETE FROM {s}.task_deps WHERE dep_id = ANY(%(ids)s) RETURNING task_id"
                        "), n AS (SELECT task_id, count(*) AS n FROM gone GROUP BY task_id)"
                        " UPDATE {s}.tasks t SET deps_left = t.deps_left - n.n,"
                        "  state = CASE WHEN t.deps_left <= n.n THEN 'pending' ELSE t.state END,"
                        "  run_at = CASE WHEN t.deps_left <= n.n THEN greatest(t.run_at, {now})"
                        "   ELSE t.run_at END,"
                        "  updated_at = CASE WHEN t.deps_left <= n.n THEN {now}"
                        "   ELSE t.updated_at END"
                        " FROM n WHERE t.id = n.task_id AND t.state = 'waiting'"
                        " RETURNING t.state"
                    ),
                    self._p(ids=ok),
                )
                woke = woke or any(r[0] == "pending" for r in await cur.fetchall())
            if bad:
                await cur.execute(
                    self._sql(
                        "DELETE FROM {s}.task_deps WHERE dep_id = ANY(%(ids)s) "
                        "RETURNING dep_id, task_id"
                    ),
                    self._p(ids=sorted(bad)),
                )
                cause: dict[str, str] = {}
                for dep, tid in sorted(await cur.fetchall()):
                    cause.setdefault(tid, dep)
                if not cause:
                    continue
                tids = sorted(cause)
                details = [f"dependency {cause[t]} ended {bad[cause[t]]}" for t in tids]
                await cur.execute(
                    self._sql(
                        "WITH dead AS ("
                        "  UPDATE {s}.tasks t SET state = 'dead', updated_at = {now},"
                        "   error = jsonb_build_object('type', 'DependencyFailed',"
                        "    'message', i.detail)::text"
                        "  FROM unnest(%(ids)s::text[], %(details)s::text[]) AS i(id, detail)"
                        "  WHERE t.id = i.id AND t.state = 'waiting'"
                        "  RETURNING t.id, t.fence, i.detail"
                        "), events AS ("
                        "  INSERT INTO {s}.task_events (task_id, at, event, fence, detail)"
                        "  SELECT id, {now}, 'dead', fence, detail FROM dead"
                        ") SELECT id FROM dead"
                    ),
                    self._p(ids=tids, details=details),
                )
                todo.extend((r[0], "dead") for r in await cur.fetchall())
        if woke:
            await self._notify(cur)

    # -- management ------------------------------------------------------------------------
    async def _manage(
        self, task_id: str, target: TaskState, operation: str, allowed: Iterable[TaskState]
    ) -> Task:
        allowed_states = frozenset(allowed)

        async def run(cur: Cursor) -> None:
            await cur.execute(
                self._sql("SELECT state, fence, owner FROM {s}.tasks WHERE id = %s FOR UPDATE"),
                (task_id,),
            )
            row = await cur.fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            if TaskState(row[0]) not in allowed_states:
                raise InvalidTransition(task_id, row[0], operation)
            if target == TaskState.CANCELLED:
                await cur.execute(
                    self._sql(
                        "UPDATE {s}.tasks SET state = 'cancelled', owner = NULL, "
                        "lease_deadline = NULL, updated_at = {now} WHERE id = %(id)s"
                    ),
                    self._p(id=task_id),
                )
                await cur.execute(
                    self._sql("DELETE FROM {s}.task_deps WHERE task_id = %s"), (task_id,)
                )
                await self._settle_dependents(cur, [(task_id, "cancelled")])
                event = "cancelled"
            else:
                await cur.execute(
                    self._sql(
                        "UPDATE {s}.tasks SET state = 'pending', attempts = 0, run_at = {now}, "
                        "updated_at = {now} WHERE id = %(id)s"
                    ),
                    self._p(id=task_id),
                )
                event = "retried"
            await cur.execute(
                self._sql(
                    "INSERT INTO {s}.task_events (task_id, at, event, fence, expert) "
                    "VALUES (%(id)s, {now}, %(event)s, %(fence)s, %(expert)s)"
                ),
                self._p(id=task_id, event=event, fence=row[1], expert=row[2]),
            )
            await self._notify(cur)

        await self._run(run)
        return await self.get(task_id)

    async def cancel(self, task_id: str) -> Task:
        allowed = [s for s in TaskState if can_move(s, TaskState.CANCELLED)]
        return await self._manage(task_id, TaskState.CANCELLED, "cancel", allowed)

    async def retry(self, task_id: str) -> Task:
        allowed = [TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED]
        return await self._manage(task_id, TaskState.PENDING, "retry", allowed)

    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        ttl = check_ttl(lease_ttl)
        session = uuid.uuid4().hex

        async def run(cur: Cursor) -> None:
            # The old session's claims end with it: a new session never inherits them.
            await cur.execute(
                self._sql(
                    "UPDATE {s}.tasks t SET lease_deadline = least(t.lease_deadline, "
                    "e.lease_deadline) FROM {s}.experts e WHERE e.id = %(id)s "
                    "AND e.lease_deadline < {now} AND t.owner = e.id "
                    "AND t.state IN ('claimed', 'running')"
                ),
                self._p(id=info.id),
            )
            await cur.execute(
                self._sql(
                    "INSERT INTO {s}.experts AS e (id, session, info, lease_deadline, "
                    "heartbeat_at, started_at) VALUES (%(id)s, %(session)s, %(info)s, "
                    "{now} + %(ttl)s, {now}, {now}) "
                    "ON CONFLICT (id) DO UPDATE SET session = excluded.session, "
                    "info = excluded.info, lease_deadline = excluded.lease_deadline, "
                    "heartbeat_at = excluded.heartbeat_at, started_at = excluded.started_at, "
                    "load = 0, claim_attempts = 0, claims_won = 0, tasks_done = 0, metrics = '{}' "
                    "WHERE e.lease_deadline < {now} RETURNING 1"
                ),
                self._p(id=info.id, session=session, info=info.to_json_text(), ttl=ttl),
            )
            if await cur.fetchone() is not None:
                return
            await cur.execute(self._sql("SELECT info FROM {s}.experts WHERE id = %s"), (info.id,))
            other = ExpertInfo.from_json_text(_one(await cur.fetchone())[0])
            raise ExpertConflict(
                f"expert id {info.id!r} is live elsewhere (host {other.host or '?'}, pid "
                f"{other.pid}); pick another --name or stop that expert"
            )

        await self._run(run)
        return session

    async def deregister_expert(self, expert: str, session: str) -> None:
        async def run(cur: Cursor) -> None:
            await cur.execute(
                self._sql(
                    "UPDATE {s}.experts SET lease_deadline = least(lease_deadline, "
                    "{now} - 1e-6), load = 0 WHERE id = %(expert)s AND session = %(session)s"
                ),
                self._p(expert=expert, session=session),
            )

        await self._run(run, tx=False)

    async def purge_all(self) -> None:
        """Delete every task, its history and every expert in this schema (benchmarks use it
        to start from an empty store). Not part of the port; there is no undo."""

        async def run(cur: Cursor) -> None:
            await cur.execute(
                self._sql("TRUNCATE {s}.tasks, {s}.task_deps, {s}.task_events, {s}.experts")
            )
            await self._notify(cur)

        await self._run(run)

    # -- wake-ups --------------------------------------------------------------------------
    @property
    def listening(self) -> bool:
        """True while the LISTEN connection is up (wake-ups are pushed, not polled)."""
        return self._listening

    def _touch(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def _listen_connect(self) -> AsyncConnection[TupleRow]:
        dsn = self._listen_url or self._dsn
        if self._listen_url:
            dsn, _ = parse_postgres_url(self._listen_url)
        kwargs = self._connect_kwargs(dsn)
        name = psycopg.conninfo.conninfo_to_dict(dsn).get("application_name") or "contend"
        kwargs["application_name"] = f"{name}-listen"
        conn = await AsyncConnection.connect(dsn, **kwargs)
        try:
            await conn.execute(f'LISTEN "{self.channel}"')
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _start_listener(self) -> None:
        try:
            conn = await asyncio.wait_for(self._listen_connect(), self._retry_deadline)
        except (psycopg.Error, TimeoutError) as exc:
            raise StoreError(
                f"cannot LISTEN on PostgreSQL at {_safe(self._listen_url or self._dsn)}: {exc}; "
                "add ?listen=off to the store URL to poll instead"
            ) from exc
        self._listener_conn = conn
        self._listening = True
        self._listener = asyncio.get_running_loop().create_task(
            self._listen_loop(conn), name=f"contend-listen-{self.schema}"
        )

    async def _listen_loop(self, conn: AsyncConnection[TupleRow] | None) -> None:
        """Turn notifications into wake-ups; on a lost connection, poll and reconnect.

        It stops when ``_closing`` is set: psycopg may turn a cancellation that lands inside
        a connection attempt into an OperationalError, so cancelling alone is not enough."""
        pause = 0.05
        while not self._closing:
            if conn is None:
                try:
                    conn = await asyncio.wait_for(self._listen_connect(), self._retry_deadline)
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    if self._closing:
                        return
                    log.warning("LISTEN connection failed (%s); retrying in %.2fs", exc, pause)
                    await asyncio.sleep(random.uniform(pause / 2, pause))
                    pause = min(pause * 2, 2.0)
                    continue
                if self._closing:
                    await conn.close()
                    return
                self._listener_conn = conn
                self._listening = True
                self._touch()  # changes may have been missed while it was down
                log.info("LISTEN connection restored")
            pause = 0.05
            try:
                async for _ in conn.notifies():
                    self._touch()
            except psycopg.Error as exc:
                if not self._closing:
                    log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            self._listening = False
            self._listener_conn = None
            try:
                await conn.close()
            except psycopg.Error:
                pass
            conn = None
            self._touch()

    async def wait_for_change(self, timeout: float) -> None:
        """Return on a notification (or a missed one), else after *timeout* seconds; while the
        LISTEN connection is down (or disabled), after at most the poll interval."""
        if self._version == self._seen:
            wait = timeout if self._listening else min(timeout, self._poll_interval)
            if wait > 0:
                try:
                    await asyncio.wait_for(self._changed.wait(), wait)
                except TimeoutError:
                    pass
        self._seen = self._version

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        async def run(cur: Cursor) -> Backlog:
            await cur.execute(
                self._sql(
                    "SELECT {now}, count(*), min(run_at) FROM {s}.tasks WHERE state = 'pending' "
                    "AND queue = ANY(%(queues)s) AND run_at <= {now}"
                ),
                self._p(queues=list(queues)),
            )
            now, n, oldest = _one(await cur.fetchone())
            return Backlog(int(n), None if oldest is None else now - oldest)

        return await self._run(run, tx=False)

    # -- auctions --------------------------------------------------------------------------
    async def bid(
        self, expert: str, session: str, task_id: str, score: float, window: float
    ) -> Auction:
        score, window = check_bid(score, window)

        async def run(cur: Cursor) -> Auction:
            await self._check_session(cur, expert, session)
            await cur.execute(
                self._sql(
                    "SELECT {now}, t.state, a.closes_at FROM {s}.tasks t "
                    "LEFT JOIN {s}.auctions a ON a.task_id = t.id WHERE t.id = %(id)s "
                    "FOR SHARE OF t"
                ),
                self._p(id=task_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            now, state, closes = row
            if state != "pending":
                return Auction(task_id, now, now if closes is None else closes, (), open=False)
            # The first bid opens the auction; a repeated bid keeps its place in time.
            await cur.execute(
                self._sql(
                    "WITH opened AS ("
                    "  INSERT INTO {s}.auctions (task_id, closes_at)"
                    "  VALUES (%(id)s, {now} + %(window)s) ON CONFLICT DO NOTHING"
                    "), placed AS ("
                    "  INSERT INTO {s}.bids (task_id, expert, score, at)"
                    "  VALUES (%(id)s, %(expert)s, %(score)s, {now})"
                    "  ON CONFLICT (task_id, expert) DO UPDATE SET score = excluded.score"
                    ") SELECT 1"
                ),
                self._p(id=task_id, window=window, expert=expert, score=score),
            )
            # a separate statement, to see this bid and every other committed one
            await cur.execute(
                self._sql(
                    "SELECT a.closes_at, b.expert, b.score, b.at FROM {s}.auctions a "
                    "LEFT JOIN {s}.bids b ON b.task_id = a.task_id WHERE a.task_id = %s"
                ),
                (task_id,),
            )
            rows = await cur.fetchall()
            bids = {r[1]: (r[2], r[3]) for r in rows if r[1] is not None}
            return Auction(task_id, now, rows[0][0], rank_bids(bids))

        return await self._run(run)

    async def next_due(self, queues: Sequence[str]) -> float | None:
        if not queues:
            return None

        async def run(cur: Cursor) -> float | None:
            await cur.execute(
                self._sql(
                    "SELECT min(run_at) FROM {s}.tasks WHERE state = 'pending' AND queue = ANY(%s)"
                ),
                (list(queues),),
            )
            row = await cur.fetchone()
            return None if row is None else row[0]

        return await self._run(run, tx=False)


def _dependencies_first(specs: Sequence[TaskSpec]) -> list[TaskSpec]:
    """*specs* reordered so that each comes after those of the batch it depends on (the batch
    has been checked for cycles); otherwise in their given order."""
    by_id = {s.id: s for s in specs}
    done: set[str] = set()
    out: list[TaskSpec] = []

    def visit(spec: TaskSpec) -> None:
        stack = [(spec, iter(spec.depends_on))]
        done.add(spec.id)
        while stack:
            node, deps = stack[-1]
            dep = next((d for d in deps if d in by_id and d not in done), None)
            if dep is None:
                out.append(node)
                stack.pop()
            else:
                done.add(dep)
                stack.append((by_id[dep], iter(by_id[dep].depends_on)))

    for spec in specs:
        if spec.id not in done:
            visit(spec)
    return out


def _claimed(r: Sequence[Any]) -> Claimed:
    return Claimed(
        id=r[0],
        type=r[1],
        queue=r[2],
        args=json.loads(r[3]),
        kwargs=json.loads(r[4]),
        fence=r[5],
        attempt=r[6],
        max_attempts=r[7],
        checkpoint=_load(r[8]),
        timeout=r[9],
        lease_deadline=r[10],
        priority=r[11],
    )


def _one(row: T | None) -> T:
    if row is None:
        raise StoreError("PostgreSQL returned no row where one was expected")
    return row


def _safe(dsn: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if "@" in netloc:
        cred, _, host = netloc.rpartition("@")
        netloc = f"{cred.split(':', 1)[0]}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _load(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


def _req_json(req: Requirements) -> str | None:
    data = req.to_json()
    return None if data is None else json.dumps(data, separators=(",", ":"))


def _error_json(kind: str, message: str) -> str:
    return json.dumps({"type": kind, "message": message})
