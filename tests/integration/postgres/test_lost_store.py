"""PostgreSQL: the expert's database is dropped and created again, empty, under a running
expert (or its schema is dropped). Its pool reconnects to the new database; the expert must stop
with a clear SchemaError within a few heartbeats and write nothing there (no schema, no row)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import psycopg
import pytest

from contend import Expert, SchemaError
from tests.integration.lease_faults import HEARTBEAT, LEASE, SideEffects, make_app, until

pytestmark = pytest.mark.postgres

#: The expert must have stopped this long after the fault (a few heartbeats).
STOP_WITHIN = LEASE + 2 * HEARTBEAT


async def _admin(url: str, *statements: str) -> None:
    parts = urlsplit(url)
    async with await psycopg.AsyncConnection.connect(
        parts._replace(path="/postgres").geturl(), autocommit=True
    ) as admin:
        for statement in statements:
            await admin.execute(statement)


async def _relations(url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
        )
        found = [r[0] for r in await cur.fetchall()]
        cur = await conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = 'contend'")
        return found + [f"schema {r[0]}" for r in await cur.fetchall()]


@pytest.mark.parametrize("fault", ["database", "schema"])
async def test_an_expert_whose_schema_is_gone_stops_and_writes_nothing(
    pg_url: str, fault: str
) -> None:
    name = urlsplit(pg_url).path.lstrip("/")
    effects = SideEffects()
    app = make_app(pg_url, effects)
    e = Expert(app, name="a", lease_ttl=LEASE, concurrency=1)
    runner = asyncio.create_task(e.run())
    try:
        await app.submit("work", [60.0])
        await until(lambda: effects.started("a"), 10, "the first run")
        if fault == "database":
            await _admin(
                pg_url, f'DROP DATABASE "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"'
            )
        else:
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute("DROP SCHEMA contend CASCADE")
        at = time.monotonic()
        with pytest.raises(SchemaError, match="lost its contend tables"):
            await asyncio.wait_for(runner, STOP_WITHIN + 10)
        took = time.monotonic() - at
        print(f"\nPostgreSQL, {fault} dropped: the expert stopped after {took:.2f}s")
        assert took <= STOP_WITHIN, f"went on for {took:.2f}s"
        stopped = effects.stopped("a")
        assert stopped is not None and stopped - at <= STOP_WITHIN
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await app.aclose()
    assert await _relations(pg_url) == []
