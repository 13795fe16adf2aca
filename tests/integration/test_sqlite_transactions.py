"""A task's own transaction on a real SQLite file: a block that ends the transaction itself, a
failed statement, the write lock held by the block, and the connections kept."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import FencedOut, StoreError
from contend.store.port import Claimed, Completion, ExpertInfo
from contend.store.sqlite import SQLiteStore, SQLiteTransaction
from contend.testing import FakeClock


@pytest.fixture
async def store(tmp_path: Path) -> SQLiteStore:
    s = SQLiteStore(f"sqlite:///{tmp_path / 's.db'}", clock=FakeClock(), busy_deadline=5)
    await s.open()
    conn = sqlite3.connect(s.path)
    conn.execute("CREATE TABLE effects (n INTEGER NOT NULL)")
    conn.execute("INSERT INTO effects VALUES (0)")
    conn.commit()
    conn.close()
    yield s  # type: ignore[misc]
    await s.close()


def effect(store: SQLiteStore) -> int:
    conn = sqlite3.connect(store.path)
    try:
        return int(conn.execute("SELECT n FROM effects").fetchone()[0])
    finally:
        conn.close()


async def claim(store: SQLiteStore, n: int = 1) -> list[Claimed]:
    await store.submit([TaskSpec.build("job", []) for _ in range(n)])
    sid = await store.register_expert(ExpertInfo("e"), 30)
    return await store.claim("e", sid, ["default"], Capabilities(), limit=n, lease_ttl=30)


def done(c: Claimed) -> Completion:
    return Completion(c.id, c.fence, '"ok"')


@pytest.mark.parametrize("end", ["COMMIT", "ROLLBACK"])
async def test_a_block_that_ends_the_transaction_itself_is_refused(
    store: SQLiteStore, end: str
) -> None:
    (c,) = await claim(store)
    tx = await store.begin("e", c.id, c.fence)
    assert isinstance(tx, SQLiteTransaction)
    tx.connection.execute("UPDATE effects SET n = n + 1")
    tx.connection.execute(end)
    with pytest.raises(StoreError, match="ended inside the block"):
        await tx.commit(done(c))
    assert (await store.get(c.id)).state == TaskState.RUNNING
    assert effect(store) == (1 if end == "COMMIT" else 0)
    tx = await store.begin("e", c.id, c.fence)  # the lock was given back
    await tx.commit(done(c))
    assert (await store.get(c.id)).state == TaskState.SUCCEEDED


async def test_a_failed_statement_the_block_caught_does_not_undo_the_rest(
    store: SQLiteStore,
) -> None:
    (c,) = await claim(store)
    tx = await store.begin("e", c.id, c.fence)
    tx.connection.execute("UPDATE effects SET n = n + 1")
    with pytest.raises(sqlite3.OperationalError):
        tx.connection.execute("SELECT * FROM no_such_table")
    await tx.commit(done(c))
    assert effect(store) == 1


async def test_the_block_holds_the_write_lock_and_others_wait(store: SQLiteStore) -> None:
    a, b = await claim(store, 2)
    other = SQLiteStore(store.url, clock=store._db.clock, busy_deadline=5)
    await other.open()
    try:
        # another connection retries until the lock is free
        ta = await store.begin("e", a.id, a.fence)
        write = asyncio.ensure_future(other.complete("e", [done(b)]))
        for _ in range(30):
            await asyncio.sleep(0.005)
        assert not write.done()
        await ta.rollback()
        assert await asyncio.wait_for(write, 5) == [None]
        # a task of the same process queues for its turn, and then finds the task completed
        ta = await store.begin("e", a.id, a.fence)
        again = asyncio.ensure_future(store.begin("e", a.id, a.fence))
        for _ in range(30):
            await asyncio.sleep(0.005)
        assert not again.done()
        await ta.commit(done(a))
        with pytest.raises(FencedOut):
            await asyncio.wait_for(again, 5)
    finally:
        await other.close()
