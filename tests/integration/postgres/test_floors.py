"""Claims that start at a floor (``contend.store.postgres.floors``), on a real PostgreSQL: the
claim order stands (a higher priority first, first in first out within one, lower levels when
the floor's is empty), a task given back below the floor waits for the next full walk, and
behind a transaction that holds vacuum back, a claim reads past the entries of the tasks
claimed since it began only once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.port import ExpertInfo
from contend.store.postgres import PostgresStore, floors
from contend.testing import FakeClock
from tests.integration.postgres.conftest import StoreFactory

#: Whether claims may start at their floors (their cost, which decides it, is left out).
FORCED = [False]


@pytest.fixture(autouse=True)
def forced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(
        floors.Shape, "use", lambda self, now, heard=True: bool(self.floors) and FORCED[0]
    )
    yield
    FORCED[0] = False


async def _claim(store: PostgresStore, session: str, limit: int) -> list[str]:
    got = await store.claim("e", session, ["default"], Capabilities(), limit=limit, lease_ttl=60)
    return [c.id for c in got]


async def test_a_floored_claim_keeps_the_claim_order(store: PostgresStore) -> None:
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    plain = [TaskSpec.build("t", [n]) for n in range(6)]
    await store.submit(plain)
    assert await _claim(store, session, 2) == [plain[0].id, plain[1].id]  # a full walk
    FORCED[0] = True
    urgent, low = TaskSpec.build("t", priority=5), TaskSpec.build("t", priority=-5)
    await store.submit([low, urgent])
    # the level above the floor's first, then the floor's own in order, then the one below
    assert await _claim(store, session, 3) == [urgent.id, plain[2].id, plain[3].id]
    assert await _claim(store, session, 3) == [plain[4].id, plain[5].id, low.id]
    assert await _claim(store, session, 3) == []


async def test_a_task_given_back_below_the_floor_waits_for_a_full_walk(
    store: PostgresStore,
) -> None:
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    specs = [TaskSpec.build("t", [n]) for n in range(6)]
    await store.submit(specs)
    first = await store.claim("e", session, ["default"], Capabilities(), limit=2, lease_ttl=60)
    FORCED[0] = True
    assert await _claim(store, session, 2) == [specs[2].id, specs[3].id]  # floor: specs[2]
    assert await store.release("e", [(first[0].id, first[0].fence)]) == [None]
    # below the floor: a floored claim does not see it (this is what floors skip)...
    assert await _claim(store, session, 1) == [specs[4].id]
    FORCED[0] = False
    # ...the next full walk does, before anything due later
    assert await _claim(store, session, 2) == [specs[0].id, specs[5].id]


async def test_behind_held_vacuum_a_claim_reads_only_past_its_floor(
    make_store: StoreFactory, pg_url: str
) -> None:
    store = await make_store(pool_size=1)  # its statistics flushed on the claims' connection
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    await store.submit([TaskSpec.build("t", [n]) for n in range(2_000)])
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as holder:
        await holder.execute("BEGIN")
        await holder.execute("SELECT txid_current()")
        for _ in range(150):  # 1,500 tasks claimed (their pending versions stay)
            assert len(await _claim(store, session, 10)) == 10
        full = await _entries_read(store, pg_url, session)
        FORCED[0] = True
        await _claim(store, session, 10)  # learns the floor past those
        floored = await _entries_read(store, pg_url, session)
    assert full >= 1_500, full  # the full walk passed every claimed task's entry
    assert floored <= 30, floored  # its own 10 and the last claim's 10


async def _entries_read(
    store: PostgresStore,
    pg_url: str,
    session: str,
    *,
    limit: int = 10,
    index: str = "tasks_claimable",
) -> int:
    """Index entries *index* gave one claim of *limit*, read from the statistics."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:

        async def read() -> int:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            cur = await conn.execute(
                "SELECT idx_tup_read FROM pg_stat_user_indexes"
                " WHERE schemaname = 'contend' AND indexrelname = %s",
                (index,),
            )
            row = await cur.fetchone()
            assert row is not None
            return int(row[0])

        await _flush(store)
        before = await read()
        assert len(await _claim(store, session, limit)) == limit
        await _flush(store)
        return await read() - before


async def _flush(store: PostgresStore) -> None:
    """Have the store's one connection report its statistics now (PostgreSQL 15 and later:
    otherwise a backend reports them once a second at most)."""

    async def run(cur: psycopg.AsyncCursor) -> None:
        await cur.execute("SELECT pg_stat_force_next_flush()")

    await store._db.run(run, tx=False)


async def test_next_due_later_leaves_out_what_is_due(
    store: PostgresStore, clock: FakeClock
) -> None:
    # the idle wait's read: the tasks due already are the claimed ones' dead entries' side of
    # the index, so it seeks past them and names only what falls due later
    await store.submit([TaskSpec.build("t"), TaskSpec.build("t", delay=30.0)])
    assert await store.next_due(["default"]) == clock.now()
    assert await store.next_due(["default"], later=True) == clock.now() + 30.0
    assert await store.next_due(["other"], later=True) is None


async def test_a_low_lane_looks_for_levels_only_where_there_are_some(
    make_store: StoreFactory, pg_url: str
) -> None:
    store = await make_store(pool_size=1)
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    await store.submit([TaskSpec.build("t", [n]) for n in range(20)])

    async def lane_claim() -> int:
        await _flush(store)
        before = await _index_read(pg_url, "tasks_lane")
        got = await store.claim(
            "e", session, ["default"], Capabilities(), limit=4, lease_ttl=60, low_lane=1
        )
        assert len(got) == 4
        await _flush(store)
        return await _index_read(pg_url, "tasks_lane") - before

    # every task at priority 0: nothing below the top, and the lane's skip scan is left out
    assert await lane_claim() == 0
    low = TaskSpec.build("t", priority=-1)
    await store.submit([low])  # a second level: the lane looks, and takes it
    assert await lane_claim() > 0
    assert (await store.get(low.id)).state == TaskState.RUNNING
    # a lean claim still (the levels are not a feature the lean claim leaves out)
    assert store._db.lean


async def _index_read(pg_url: str, index: str) -> int:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute(
            "SELECT idx_tup_read FROM pg_stat_user_indexes"
            " WHERE schemaname = 'contend' AND indexrelname = %s",
            (index,),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_a_task_given_back_is_heard_of_and_claimed_at_once(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()  # floors used as the store decides: here, as if whole walks were costly
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    specs = [TaskSpec.build("t", [n]) for n in range(6)]
    await store.submit(specs)
    first = await store.claim("e", session, ["default"], Capabilities(), limit=2, lease_ttl=60)
    (shape,) = store._db.floors.values()
    shape.full_cost = 1.0  # a whole walk costs a second: floors for the next 10 s
    assert store._db.floors_heard and shape.use(floors.clock())
    assert await _claim(store, session, 2) == [specs[2].id, specs[3].id]  # floor: specs[2]
    assert await store.release("e", [(first[0].id, first[0].fence)]) == [None]
    # the release's notice says a task may stand below the floor: the next claim walks whole
    for _ in range(500):
        if not shape.use(floors.clock()):
            break
        await asyncio.sleep(0.01)
    assert await _claim(store, session, 1) == [specs[0].id]


async def test_a_claims_walk_can_take_no_index_but_the_claim_orders(
    make_store: StoreFactory, pg_url: str
) -> None:
    # With statistics that say few tasks are pending, a generic plan read the smallest index
    # whose predicate the claim implied (tasks_ageing) and sorted: behind a transaction that
    # held vacuum back it fetched every held-back entry there, past any floor (the sustained
    # run: 9,181 buffers a claim). Here tasks_claimable is gone and every plan has to take
    # another index if one can serve the walk: none may.
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        name = pg_url.rsplit("/", 1)[1]
        await conn.execute(f'ALTER DATABASE "{name}" SET enable_seqscan = off')
        await conn.execute(f'ALTER DATABASE "{name}" SET enable_bitmapscan = off')
    store = await make_store(pool_size=1)
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    await store.submit([TaskSpec.build("t", [n]) for n in range(40)])
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("DROP INDEX contend.tasks_claimable")
    others = ("tasks_oldest", "tasks_ageing", "tasks_lane")
    read = {i: await _entries_read(store, pg_url, session, limit=5, index=i) for i in others}
    FORCED[0] = True  # the walks from the floor that claim learned
    read |= {i + "*": await _entries_read(store, pg_url, session, limit=5, index=i) for i in others}
    assert set(read.values()) == {0}, read
    # what those indexes are for still takes them, each its own
    before = await _index_reads(store, pg_url)
    assert await store.next_due(["default"]) is not None
    assert (await store.backlog(["default"])).pending == 10
    after = await _index_reads(store, pg_url)
    assert after["tasks_oldest"] > before["tasks_oldest"], (before, after)
    assert after["tasks_ageing"] == before["tasks_ageing"], (before, after)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute(
            "EXPLAIN SELECT id FROM contend.tasks WHERE state = 'pending'"
            " AND promote_at <= 1e12 LIMIT 5000 FOR UPDATE SKIP LOCKED"
        )
        assert "tasks_ageing" in str(await cur.fetchall())


async def _index_reads(store: PostgresStore, pg_url: str) -> dict[str, int]:
    await _flush(store)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes"
            " WHERE schemaname = 'contend' AND relname = 'tasks'"
        )
        return {name: int(n) for name, n in await cur.fetchall()}
