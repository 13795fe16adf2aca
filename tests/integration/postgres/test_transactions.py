"""A task's own transaction on a real PostgreSQL: what the block may do to it, a serialization
conflict, the task's own rows locked until the end, and its dependants settled with it."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import StoreError, TransactionConflict
from contend.store.port import Claimed, Completion, ExpertInfo
from contend.store.postgres import PostgresStore, PostgresTransaction
from contend.store.postgres.url import parse_postgres_url
from contend.testing import FakeClock

pytestmark = pytest.mark.postgres


async def claim(store: PostgresStore, specs: list[TaskSpec], n: int = 1) -> list[Claimed]:
    await store.submit(specs)
    sid = await store.register_expert(ExpertInfo("e"), 30)
    return await store.claim("e", sid, ["default"], Capabilities(), limit=n, lease_ttl=30)


def done(c: Claimed) -> Completion:
    return Completion(c.id, c.fence, '"ok"')


async def setup_table(store: PostgresStore) -> str:
    dsn = parse_postgres_url(store.url)[0]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE effects (id text PRIMARY KEY, n int NOT NULL)")
        await conn.execute("INSERT INTO effects VALUES ('a', 0)")
    return dsn


async def effect(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (await conn.execute("SELECT n FROM effects WHERE id = 'a'")).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("misuse", ["failed statement", "own commit", "own rollback"])
async def test_a_transaction_the_block_broke_is_refused_and_completes_nothing(
    store: PostgresStore, misuse: str
) -> None:
    dsn = await setup_table(store)
    (c,) = await claim(store, [TaskSpec.build("job", [])])
    tx = await store.begin("e", c.id, c.fence)
    assert isinstance(tx, PostgresTransaction)
    conn = tx.connection
    await conn.execute("UPDATE effects SET n = n + 1")
    if misuse == "failed statement":
        with pytest.raises(psycopg.errors.UndefinedTable):
            await conn.execute("SELECT * FROM no_such_table")
    else:
        await conn.execute("COMMIT" if misuse == "own commit" else "ROLLBACK")
    with pytest.raises(StoreError, match=r"aborted|ended inside the block"):
        await tx.commit(done(c))
    task = await store.get(c.id)
    assert (task.state, task.owner) == (TaskState.RUNNING, "e")
    assert await effect(dsn) == (1 if misuse == "own commit" else 0)  # its own commit stands


async def test_a_savepoint_inside_the_block_is_fine(store: PostgresStore) -> None:
    dsn = await setup_table(store)
    (c,) = await claim(store, [TaskSpec.build("job", [])])
    tx = await store.begin("e", c.id, c.fence)
    await tx.connection.execute("UPDATE effects SET n = n + 1")
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with tx.connection.transaction():  # a savepoint: its failure is undone alone
            await tx.connection.execute("INSERT INTO effects VALUES ('a', 5)")
    await tx.commit(done(c))
    assert await effect(dsn) == 1
    assert (await store.get(c.id)).state == TaskState.SUCCEEDED


async def test_a_serialization_failure_at_commit_is_a_conflict(store: PostgresStore) -> None:
    dsn = await setup_table(store)
    (c,) = await claim(store, [TaskSpec.build("job", [])])
    tx = await store.begin("e", c.id, c.fence)
    conn = tx.connection
    # a deferred constraint trigger raising 40001 at COMMIT, as SERIALIZABLE does
    await conn.execute(
        "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$"
    )
    await conn.execute(
        "CREATE CONSTRAINT TRIGGER late AFTER UPDATE ON effects "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION boom()"
    )
    await conn.execute("UPDATE effects SET n = n + 1")
    with pytest.raises(TransactionConflict):
        await tx.commit(done(c))
    assert await effect(dsn) == 0
    assert (await store.get(c.id)).state == TaskState.RUNNING  # the claim holds


async def test_the_tasks_rows_stay_locked_until_the_commit(
    store: PostgresStore, clock: FakeClock
) -> None:
    dsn = await setup_table(store)
    a, b = await claim(store, [TaskSpec.build("job", []), TaskSpec.build("job", [])], 2)
    ta = await store.begin("e", a.id, a.fence)
    await ta.connection.execute("UPDATE effects SET n = n + 1")
    tb = await store.begin("e", b.id, b.fence)
    waiting = asyncio.ensure_future(tb.connection.execute("UPDATE effects SET n = n + 10"))
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not waiting.done()  # b waits for a's row lock
    await ta.commit(done(a))
    await asyncio.wait_for(waiting, 10)
    await tb.commit(done(b))
    assert await effect(dsn) == 11


async def test_its_dependants_are_settled_in_the_same_commit(store: PostgresStore) -> None:
    first = TaskSpec.build("job", [])
    then = TaskSpec.build("job", [], depends_on=[first.id])
    (c,) = await claim(store, [first, then])
    assert (await store.get(then.id)).state == TaskState.WAITING
    tx = await store.begin("e", c.id, c.fence)
    await tx.commit(done(c))
    assert (await store.get(then.id)).state == TaskState.PENDING
