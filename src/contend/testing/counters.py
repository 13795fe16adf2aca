"""A counter kept in a store's own database and incremented in a task's transaction
(``ctx.transaction()``): the effect the contract suite, the crash tests and the benchmark count
to see that each task's effect happened exactly once.

``counter_for(store, name)`` gives the counter for the store's backend:

=========  =======================================================================
memory     the key ``counters/{name}`` of the store's key-value space
SQLite     a row of table ``contend_counters`` in the store's own file
PostgreSQL a row of table ``contend_counters`` (the connection's default schema)
etcd       the key ``{prefix}-counters/{name}``, beside the store's prefix
=========  =======================================================================

``await counter.prepare()`` creates the table (once, before the experts start), ``await
counter.add(tx)`` increments it inside a task's transaction, ``await counter.value()`` reads it
outside one. A task increments it exactly once as::

    await ctx.transact(counter.add)       # run again on a conflict (etcd, memory)
"""

from __future__ import annotations

import functools
import sqlite3
from typing import Any, Protocol

from contend.errors import ConfigError
from contend.store.port import Store

TABLE = "contend_counters"


class Counter(Protocol):
    name: str

    async def prepare(self) -> None:
        """Create what holds the counter, if it is not there."""

    async def add(self, tx: Any, n: int = 1) -> None:
        """Add *n* inside the task's transaction *tx*."""

    async def value(self) -> int:
        """The committed value (0 before the first increment)."""


def counter_for(store: Store, name: str = "hits") -> Counter:
    """The counter *name* in *store*'s own database."""
    scheme = store.url.partition(":")[0]
    if scheme == "memory":
        return MemoryCounter(store, name)
    if scheme == "sqlite":
        return SQLiteCounter(_sqlite_path(store.url), name)
    if scheme in ("postgresql", "postgres"):
        return PostgresCounter(_postgres_dsn(store.url), name)
    if scheme == "etcd":
        return EtcdCounter(store, name)
    raise ConfigError(f"no counter for a store at {store.url!r}")


@functools.lru_cache(maxsize=64)
def _sqlite_path(url: str) -> str:
    from contend.store.sqlite import parse_sqlite_url

    return parse_sqlite_url(url)[0]


@functools.lru_cache(maxsize=64)
def _postgres_dsn(url: str) -> str:
    from contend.store.postgres import parse_postgres_url

    return parse_postgres_url(url)[0]  # parsing it costs more than a task's transaction's SQL


class MemoryCounter:
    def __init__(self, store: Store, name: str) -> None:
        self.store, self.name = store, name
        self.key = f"counters/{name}"

    async def prepare(self) -> None:
        return None

    async def add(self, tx: Any, n: int = 1) -> None:
        tx.put(self.key, int(await tx.get(self.key) or 0) + n)

    async def value(self) -> int:
        return int(self.store.value(self.key) or 0)  # type: ignore[attr-defined]


class SQLiteCounter:
    def __init__(self, path: str, name: str) -> None:
        self.path, self.name = path, name

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 10000")  # a test helper: blocking is fine here
        return conn

    async def prepare(self) -> None:
        conn = self._connect()
        try:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (name TEXT PRIMARY KEY, n INTEGER NOT NULL)"
            )
        finally:
            conn.close()

    async def add(self, tx: Any, n: int = 1) -> None:
        tx.connection.execute(
            f"INSERT INTO {TABLE} (name, n) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET n = n + excluded.n",
            (self.name, n),
        )

    async def value(self) -> int:
        conn = self._connect()
        try:
            row = conn.execute(f"SELECT n FROM {TABLE} WHERE name = ?", (self.name,)).fetchone()
        finally:
            conn.close()
        return 0 if row is None else int(row[0])


class PostgresCounter:
    def __init__(self, dsn: str, name: str) -> None:
        self.dsn, self.name = dsn, name

    async def prepare(self) -> None:
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (name text PRIMARY KEY, n bigint NOT NULL)"
            )

    async def add(self, tx: Any, n: int = 1) -> None:
        await tx.connection.execute(
            f"INSERT INTO {TABLE} AS c (name, n) VALUES (%s, %s) "
            "ON CONFLICT (name) DO UPDATE SET n = c.n + excluded.n",
            (self.name, n),
        )

    async def value(self) -> int:
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute(f"SELECT n FROM {TABLE} WHERE name = %s", (self.name,))
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])


class EtcdCounter:
    def __init__(self, store: Store, name: str) -> None:
        from contend.store.etcd.config import parse_etcd_url

        self.store, self.name = store, name
        prefix = parse_etcd_url(store.url)[2].rstrip("/")
        self.key = f"{prefix}-counters/{name}"

    async def prepare(self) -> None:
        return None

    async def add(self, tx: Any, n: int = 1) -> None:
        tx.put(self.key, str(int(await tx.get(self.key) or 0) + n))

    async def value(self) -> int:
        return int(await self.store.read_key(self.key) or 0)  # type: ignore[attr-defined]
