"""Schema creation, versions and the ``?schema=`` option."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import psycopg
import pytest

from contend.domain.limits import Rate
from contend.domain.task import Capabilities, TaskSpec
from contend.errors import SchemaError
from contend.store.port import ExpertInfo
from contend.store.postgres import PostgresStore
from contend.store.postgres.migrations import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE
from contend.testing import FakeClock

from .conftest import StoreFactory


async def sql(url: str, statement: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(statement)
        return await cur.fetchall() if cur.description else []


async def test_open_creates_the_schema_once(make_store: StoreFactory, pg_url: str) -> None:
    # several processes opening an empty database at once: one creates, the others wait
    stores = await asyncio.gather(*(make_store() for _ in range(4)))
    rows = await sql(pg_url, "SELECT version FROM contend.contend_schema_version ORDER BY 1")
    assert rows == [(m.version,) for m in MIGRATIONS]
    assert await stores[0].migrate() == []


async def test_a_schema_behind_or_ahead_is_refused(make_store: StoreFactory, pg_url: str) -> None:
    store = await make_store()
    await store.close()
    await sql(
        pg_url,
        f"INSERT INTO contend.contend_schema_version VALUES ({SCHEMA_VERSION + 1}, 'future')",
    )
    with pytest.raises(SchemaError, match="newer than this contend"):
        await make_store()
    await sql(pg_url, "DELETE FROM contend.contend_schema_version")
    with pytest.raises(SchemaError, match="run contend migrate"):
        await make_store()


async def test_migrate_brings_an_old_schema_up(make_store: StoreFactory, pg_url: str) -> None:
    # a database left by the contend that had schema version 1, with an expert in it
    await sql(pg_url, "CREATE SCHEMA contend")
    await sql(pg_url, VERSION_TABLE.replace("{s}", "contend"))
    for statement in MIGRATIONS[0].statements:
        await sql(pg_url, statement.replace("{s}", "contend"))
    await sql(pg_url, "INSERT INTO contend.contend_schema_version VALUES (1, 'first')")
    await sql(
        pg_url,
        "INSERT INTO contend.experts (id, session, info, lease_deadline, heartbeat_at, "
        """started_at) VALUES ('old', 's', '{"id": "old"}', 1, 1, 1)""",
    )
    await sql(
        pg_url,
        "INSERT INTO contend.tasks (id, type, queue, state, priority, args, kwargs, "
        "max_attempts, run_at, created_at, updated_at) "
        "VALUES ('t1', 't', 'default', 'pending', 0, '[]', '{}', 3, 1, 1, 1)",
    )
    with pytest.raises(SchemaError, match=r"at version 1.*run contend migrate"):
        await make_store()
    # migrate() works on a store that was never opened (open() would refuse)
    assert await PostgresStore(pg_url).migrate() == [m.version for m in MIGRATIONS[1:]]
    store = await make_store()
    (old,) = await store.list_experts()
    assert (old.info.id, old.metrics) == ("old", {})
    assert await store.expire() == 0  # ages the old task: it has waited since 1970
    assert [v.id for v in await store.peek(["default"], Capabilities(), 10)] == ["t1"]
    assert (await store.get("t1")).if_failed == ()  # a row from before migration 8: all fail


async def test_an_auction_open_during_the_upgrade_keeps_its_order(
    make_store: StoreFactory, pg_url: str
) -> None:
    # version 6 kept no grace: the auction gets the experts' default, 0.5 s a rank
    await sql(pg_url, "CREATE SCHEMA contend")
    await sql(pg_url, VERSION_TABLE.replace("{s}", "contend"))
    for step in MIGRATIONS[:6]:
        for statement in step.statements:
            await sql(pg_url, statement.replace("{s}", "contend"))
        await sql(pg_url, f"INSERT INTO contend.contend_schema_version VALUES ({step.version}, '')")
    close = 1_700_000_000.0
    await sql(
        pg_url,
        "INSERT INTO contend.tasks (id, type, queue, state, priority, eff_priority, promote_at, "
        "args, kwargs, max_attempts, run_at, created_at, updated_at) VALUES "
        f"('t1', 't', 'default', 'pending', 0, 0, {close + 99}, '[]', '{{}}', 3, 1, 1, 1)",
    )
    await sql(pg_url, f"INSERT INTO contend.auctions VALUES ('t1', {close})")
    await sql(
        pg_url,
        f"INSERT INTO contend.bids VALUES ('t1', 'a', 0.9, {close - 1}), "
        f"('t1', 'b', 0.5, {close - 1})",
    )
    assert await PostgresStore(pg_url).migrate() == [7, 8, 9, 10, 11, 12, 13, 14, 15]
    clock = FakeClock(close + 0.25)
    store = await make_store(clock=clock)
    b = await store.register_expert(ExpertInfo("b"), 60.0)

    async def claim() -> list[str]:
        got = await store.claim("b", b, ["default"], Capabilities(), limit=1, lease_ttl=60.0)
        return [c.id for c in got]

    assert await claim() == []  # the winner's grace
    clock.advance(0.25)
    assert await claim() == ["t1"]


async def test_migration_10_gives_old_tasks_of_a_key_its_new_rate(
    make_store: StoreFactory, pg_url: str
) -> None:
    # version 9 knew concurrency limits only: a task of key k is pending
    await sql(pg_url, "CREATE SCHEMA contend")
    await sql(pg_url, VERSION_TABLE.replace("{s}", "contend"))
    for step in MIGRATIONS[:9]:
        for statement in step.statements:
            await sql(pg_url, statement.replace("{s}", "contend"))
        await sql(pg_url, f"INSERT INTO contend.contend_schema_version VALUES ({step.version}, '')")
    await sql(
        pg_url,
        "INSERT INTO contend.tasks (id, type, queue, state, priority, eff_priority, promote_at, "
        "args, kwargs, max_attempts, run_at, created_at, updated_at, limit_key, limit_max) "
        "VALUES ('old', 't', 'default', 'pending', 0, 0, 9e9, '[]', '{}', 3, 1, 1, 1, 'k', 5)",
    )
    assert await PostgresStore(pg_url).migrate() == [10, 11, 12, 13, 14, 15]
    clock = FakeClock(1000.0)
    store = await make_store(clock=clock)
    # a new task gives key k a rate, which holds back the old task of k too
    minute = Rate.of((1, 60.0))
    new = await store.submit(
        [
            TaskSpec.build("t", limit_key="k", rate_limit=minute),
            TaskSpec.build("t", limit_key="tenant", fair=True),
        ]
    )
    e = await store.register_expert(ExpertInfo("e"), 600.0)

    async def claim() -> set[str]:
        got = await store.claim("e", e, ["default"], Capabilities(), limit=10, lease_ttl=600.0)
        return {c.id for c in got}

    assert await claim() == {"old", new[1].id}
    assert await claim() == set()  # k has no room for a minute
    rows = await sql(pg_url, "SELECT key, interval, burst, tat, full_until FROM contend.rate_keys")
    assert rows == [("k", 60.0, 1, 1060.0, 1060.0)]
    clock.advance(60.0)
    assert await claim() == {new[0].id}


async def _at_version(url: str, version: int) -> None:
    """A database left by the contend whose schema had *version*."""
    await sql(url, "CREATE SCHEMA contend")
    await sql(url, VERSION_TABLE.replace("{s}", "contend"))
    for step in MIGRATIONS[:version]:
        for statement in step.statements:
            await sql(url, statement.replace("{s}", "contend"))
        await sql(url, f"INSERT INTO contend.contend_schema_version VALUES ({step.version}, '')")


async def test_migration_11_leaves_central_tasks_out_of_the_claim_order(
    make_store: StoreFactory, pg_url: str
) -> None:
    # version 10 knew no central queues: a plain and a fair task are pending
    await _at_version(pg_url, 10)
    await sql(
        pg_url,
        "INSERT INTO contend.tasks (id, type, queue, state, priority, eff_priority, promote_at, "
        "args, kwargs, max_attempts, run_at, created_at, updated_at, limit_key, fair_key) "
        "VALUES ('plain', 't', 'default', 'pending', 0, 0, 9e9, '[]', '{}', 3, 1, 1, 1, NULL,"
        " NULL), ('fair', 't', 'default', 'pending', 1, 1, 9e9, '[]', '{}', 3, 1, 1, 1, 'k', 'k')",
    )
    assert await PostgresStore(pg_url).migrate() == [11, 12, 13, 14, 15]
    indexes = dict(
        await sql(
            pg_url,
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'contend'"
            " AND tablename = 'tasks'",
        )
    )
    for name in ("tasks_claimable", "tasks_lane", "tasks_fair"):  # rebuilt under their names
        assert "NOT central" in str(indexes[name]), indexes[name]
    assert "WHERE ((state = 'pending'::text) AND central)" in str(indexes["tasks_central"])
    assert not [n for n in indexes if str(n).endswith("_11")]
    assert await sql(pg_url, "SELECT id, central, assignee FROM contend.tasks ORDER BY id") == [
        ("fair", False, None),
        ("plain", False, None),
    ]
    store = await make_store(clock=FakeClock(1000.0))
    (given,) = await store.submit([TaskSpec.build("t", queue="default", central=True)])
    e = await store.register_expert(ExpertInfo("e"), 600.0)
    got = await store.claim("e", e, ["default"], Capabilities(), limit=10, lease_ttl=600.0)
    assert [c.id for c in got] == ["fair", "plain"]  # the central task waits for its leader
    assert await store.lead("e", e, "queue:default", 60.0) == 1
    assert await store.assign("e", e, "queue:default", 1, {given.id: "e"}) == 1
    got = await store.claim("e", e, ["default"], Capabilities(), limit=10, lease_ttl=600.0)
    assert [c.id for c in got] == [given.id]


async def test_foreign_tables_are_not_taken_over(make_store: StoreFactory, pg_url: str) -> None:
    await sql(pg_url, "CREATE SCHEMA contend")
    await sql(pg_url, "CREATE TABLE contend.orders (id int)")
    with pytest.raises(SchemaError, match="not a contend store"):
        await make_store()


async def test_schemas_keep_stores_apart(make_store: StoreFactory, pg_url: str) -> None:
    a = await make_store(pg_url + "?schema=team_a")
    b = await make_store(pg_url + "?schema=team_b")
    await a.submit([TaskSpec.build("t")])
    assert len(await a.list_tasks()) == 1
    assert await b.list_tasks() == []
    assert a.channel != b.channel


async def test_contend_migrate_on_the_command_line(pg_url: str) -> None:
    def migrate() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "contend", "migrate", "--store", pg_url],
            capture_output=True,
            text=True,
            timeout=60,
        )

    first = await asyncio.to_thread(migrate)
    assert first.returncode == 0, first.stderr
    versions = ", ".join(str(m.version) for m in MIGRATIONS)
    assert first.stdout.strip() == f"applied schema version(s) {versions}"
    again = await asyncio.to_thread(migrate)
    assert (again.returncode, again.stdout.strip()) == (0, "up to date")


async def test_an_empty_schema_is_not_created_by_a_store_that_may_not(pg_url: str) -> None:
    """``create=False`` (the read-only commands): an empty database is refused as no store
    yet, and nothing is created in it."""
    store = PostgresStore(pg_url, create=False)
    with pytest.raises(SchemaError, match=r"is absent or empty: it is not \(yet\) a contend"):
        await store.open()
    assert await sql(pg_url, "SELECT 1 FROM pg_namespace WHERE nspname = 'contend'") == []
    writer = PostgresStore(pg_url)
    await writer.open()
    await writer.close()
    reader = PostgresStore(pg_url, create=False)
    await reader.open()  # an existing store opens
    assert await reader.list_tasks() == []
    await reader.close()


async def test_a_server_without_autovacuum_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without vacuum every claim's dead row versions stay: the tables grow however short the
    retention, and claims slow down (this machine's server runs so, and nobody saw it)."""
    from contend.store.postgres import schema as pg_schema
    from contend.testing.pg_cluster import Cluster

    for autovacuum in ("off", "on"):
        c = Cluster(settings={"autovacuum": autovacuum})
        try:
            c.start()
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="contend.store.postgres"):
                for _ in range(2):  # a second store of the process says nothing more
                    store = PostgresStore(c.url)
                    await store.open()
                    await store.close()
                reader = PostgresStore(c.url, create=False)  # read-only commands: quiet
                await reader.open()
                await reader.close()
            said = [r.getMessage() for r in caplog.records if "autovacuum" in r.getMessage()]
            if autovacuum == "off":
                assert len(said) == 1, said
                assert "autovacuum is off on PostgreSQL at" in said[0]
                assert "ALTER SYSTEM SET autovacuum = on" in said[0]
            else:
                assert said == []
        finally:
            c.close()
            pg_schema._WARNED.clear()


async def test_migration_13_marks_a_store_with_priority_levels(pg_url: str) -> None:
    # version 12 had no 'levels' row: one is written where a task has a priority other than 0
    await _at_version(pg_url, 12)
    await sql(
        pg_url,
        "INSERT INTO contend.tasks (id, type, queue, state, priority, eff_priority, promote_at, "
        "args, kwargs, max_attempts, run_at, created_at, updated_at) "
        "VALUES ('low', 't', 'default', 'pending', -5, -5, 9e9, '[]', '{}', 3, 1, 1, 1)",
    )
    assert await PostgresStore(pg_url).migrate() == [13, 14, 15]
    assert await sql(pg_url, "SELECT name FROM contend.features") == [("levels",)]


async def test_migration_14_keeps_claims_off_the_other_pending_indexes(pg_url: str) -> None:
    await _at_version(pg_url, 13)
    assert await PostgresStore(pg_url).migrate() == [14, 15]
    defs = dict(
        await sql(
            pg_url,
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'contend'"
            " AND indexname IN ('tasks_oldest', 'tasks_ageing', 'tasks_lane')",
        )
    )
    assert sorted(defs) == ["tasks_ageing", "tasks_lane", "tasks_oldest"]
    assert "promote_at IS NOT NULL" in defs["tasks_ageing"], defs
    assert "created_at IS NOT NULL" in defs["tasks_oldest"] + defs["tasks_lane"], defs
