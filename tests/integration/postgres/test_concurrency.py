"""Many claimers on several store instances at once: every task goes to exactly one of them."""

from __future__ import annotations

import asyncio
import collections
import logging

import psycopg
import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import FencedOut
from contend.store.port import Completion, ExpertInfo, Heartbeat
from contend.store.postgres import PostgresStore
from contend.testing import FakeClock

from .conftest import StoreFactory
from .helpers import eventually

TASKS = 300
STORES = 4
CLAIMERS_PER_STORE = 4


async def test_parallel_claimers_never_share_a_task(make_store: StoreFactory) -> None:
    stores = [await make_store(pool_size=CLAIMERS_PER_STORE) for _ in range(STORES)]
    await stores[0].submit([TaskSpec.build("t", [n], priority=n % 3) for n in range(TASKS)])
    got: dict[str, list[str]] = collections.defaultdict(list)
    start = asyncio.Event()

    async def claimer(store: PostgresStore, name: str, lane: int) -> None:
        session = await store.register_expert(ExpertInfo(name), 60)
        await start.wait()
        while True:
            claimed = await store.claim(
                name, session, ["default"], Capabilities(), limit=3, lease_ttl=60, low_lane=lane
            )
            if not claimed:
                return
            for c in claimed:
                got[c.id].append(name)
            res = await store.complete(name, [Completion(c.id, c.fence, "null") for c in claimed])
            assert res == [None] * len(claimed)

    workers = [
        # half of them with the low lane, which locks each level's oldest where it reads them
        asyncio.create_task(claimer(store, f"s{i}-c{j}", j % 2))
        for i, store in enumerate(stores)
        for j in range(CLAIMERS_PER_STORE)
    ]
    start.set()
    await asyncio.wait_for(asyncio.gather(*workers), 60)

    assert len(got) == TASKS
    shared = {tid: names for tid, names in got.items() if len(names) > 1}
    assert shared == {}
    claimers_that_won = {names[0] for names in got.values()}
    assert len(claimers_that_won) > 1  # really concurrent, not one claimer draining the queue
    for task in await stores[0].list_tasks(limit=TASKS):
        assert (task.state, task.fence, task.attempts) == (TaskState.SUCCEEDED, 1, 1)


async def test_racing_completions_of_a_reclaimed_task_land_once(make_store: StoreFactory) -> None:
    """Old and new owner commit at the same moment: only the current fence lands."""
    clock = FakeClock()
    a = await make_store(clock=clock)
    b = await make_store(clock=clock)
    specs = [TaskSpec.build("t") for _ in range(20)]
    await a.submit(specs)
    sa = await a.register_expert(ExpertInfo("old"), 1000)
    sb = await b.register_expert(ExpertInfo("new"), 1000)
    first = await a.claim("old", sa, ["default"], Capabilities(), limit=20, lease_ttl=10)
    clock.advance(11)
    assert await b.expire() == 20
    second = await b.claim("new", sb, ["default"], Capabilities(), limit=20, lease_ttl=10)
    old_res, new_res = await asyncio.gather(
        a.complete("old", [Completion(c.id, c.fence, '"old"') for c in first]),
        b.complete("new", [Completion(c.id, c.fence, '"new"') for c in second]),
    )
    assert all(isinstance(r, FencedOut) for r in old_res)
    assert new_res == [None] * 20
    for task in await a.list_tasks(limit=100):
        assert (task.result, task.fence) == ("new", 2)


async def test_a_dependent_submitted_while_its_dependency_completes_is_released(
    make_store: StoreFactory, pg_url: str
) -> None:
    """complete(A) waits on A's row lock while submit(C after A) commits: C must not be left
    waiting for ever (the settle step has to see C's dependency row)."""
    store = await make_store()
    (a,) = await store.submit([TaskSpec.build("t")])
    session = await store.register_expert(ExpertInfo("e1"), 60)
    (claimed,) = await store.claim(
        "e1", session, ["default"], Capabilities(), limit=1, lease_ttl=60
    )
    async with await psycopg.AsyncConnection.connect(pg_url) as blocker:
        # hold A's row the way a concurrent submission does (FOR SHARE)
        await blocker.execute("SELECT 1 FROM contend.tasks WHERE id = %s FOR SHARE", (a.id,))
        completing = asyncio.create_task(
            store.complete("e1", [Completion(a.id, claimed.fence, "1")])
        )

        async def complete_is_waiting() -> bool:
            async with await psycopg.AsyncConnection.connect(pg_url) as conn:
                cur = await conn.execute(
                    # the store's connections (application_name contend) and only complete()
                    # among them touches A's row now
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND application_name = 'contend'"
                )
                row = await cur.fetchone()
                return row is not None and row[0] > 0

        await eventually(complete_is_waiting, what="complete() waiting on the row lock")
        (c,) = await store.submit([TaskSpec.build("t", depends_on=[a.id])])
        assert (await store.get(c.id)).state == TaskState.WAITING
        await blocker.commit()
    assert await asyncio.wait_for(completing, 10) == [None]
    assert (await store.get(c.id)).state == TaskState.PENDING


async def test_concurrent_first_bids_open_one_auction_and_its_order_holds(
    make_store: StoreFactory,
) -> None:
    """Eight experts on four store instances bid on a fresh task at once, each with its own
    window and grace: they all see one auction (one close, one grace), every bid is ranked,
    and after the close, of all of them claiming at once, only the top bidder gets the task.
    When it lets go during its grace, nobody else may take it until the grace is over; then,
    of all but the winner, only the second."""
    clock = FakeClock()
    stores = [await make_store(clock=clock, pool_size=2) for _ in range(4)]
    (sub,) = await stores[0].submit([TaskSpec.build("t")])
    names = [f"e{n}" for n in range(8)]
    sessions = {
        n: await stores[i % 4].register_expert(ExpertInfo(n), 600) for i, n in enumerate(names)
    }

    def store_of(name: str) -> PostgresStore:
        return stores[names.index(name) % 4]

    bids = await asyncio.gather(
        *(
            store_of(n).bid(n, sessions[n], sub.id, (i % 3) / 4, 1.0 + i, 0.5 + i)
            for i, n in enumerate(names)
        )
    )
    assert len({(a.closes_at, a.grace) for a in bids}) == 1
    auction = await store_of("e0").bid("e0", sessions["e0"], sub.id, 0.0, 1.0)  # its bid again
    assert sorted(n for n, _ in auction.bids) == names
    top, second = auction.bids[0][0], auction.bids[1][0]

    async def everyone_claims(but: str = "") -> list[str]:
        claimers = [n for n in names if n != but]
        got = await asyncio.gather(
            *(
                store_of(n).claim(
                    n,
                    sessions[n],
                    ["default"],
                    Capabilities(),
                    limit=1,
                    lease_ttl=60,
                    task_ids=[sub.id] if j % 2 else None,
                )
                for j, n in enumerate(claimers)
            )
        )
        return [n for n, claimed in zip(claimers, got, strict=True) if claimed]

    clock.value = auction.closes_at - 0.01
    assert await everyone_claims() == []
    clock.value = auction.closes_at
    assert await everyone_claims() == [top]
    assert await store_of(top).release(top, [(sub.id, 1)]) == [None]
    assert await everyone_claims(but=top) == []  # the winner's grace is not over
    clock.value = auction.closes_at + auction.grace
    assert await everyone_claims(but=top) == [second]


async def test_racing_claimers_keep_a_concurrency_limit(
    make_store: StoreFactory, pg_url: str
) -> None:
    """Eight store instances, two claimers each, claim at once from 30 tasks of one key with
    limit 3 (and 10 without a key): never more than 3 of the key are claimed or running, as
    counted by the claimers and by the database itself, and every task is done once."""
    stores = [await make_store(pool_size=2) for _ in range(8)]
    keyed = [TaskSpec.build("t", [n], limit_key="tenant:a", concurrency_limit=3) for n in range(30)]
    await stores[0].submit([*keyed, *(TaskSpec.build("t", [n]) for n in range(10))])
    key_of = {s.id: s.limit_key for s in keyed}
    holding: set[str] = set()
    peaks = {"claimers": 0, "database": 0}
    got: dict[str, list[str]] = collections.defaultdict(list)
    start, finished = asyncio.Event(), asyncio.Event()

    async def claimer(store: PostgresStore, name: str) -> None:
        session = await store.register_expert(ExpertInfo(name), 60)
        await start.wait()
        idle = 0
        while idle < 20:
            claimed = await store.claim(
                name, session, ["default"], Capabilities(), limit=2, lease_ttl=60
            )
            idle = 0 if claimed else idle + 1
            mine = [c.id for c in claimed if key_of.get(c.id)]
            holding.update(mine)
            peaks["claimers"] = max(peaks["claimers"], len(holding))
            for c in claimed:
                got[c.id].append(name)
            await asyncio.sleep(0.005 if claimed else 0.01)  # hold them a while
            holding.difference_update(mine)
            res = await store.complete(name, [Completion(c.id, c.fence, "null") for c in claimed])
            assert res == [None] * len(claimed)

    async def watch(url: str) -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while not finished.is_set():
                cur = await conn.execute(
                    "SELECT count(*) FROM contend.tasks WHERE limit_key = 'tenant:a'"
                    " AND state IN ('claimed', 'running')"
                )
                row = await cur.fetchone()
                assert row is not None
                peaks["database"] = max(peaks["database"], int(row[0]))
                await asyncio.sleep(0.001)

    watcher = asyncio.create_task(watch(pg_url))
    workers = [
        asyncio.create_task(claimer(store, f"s{i}-c{j}"))
        for i, store in enumerate(stores)
        for j in range(2)
    ]
    start.set()
    await asyncio.wait_for(asyncio.gather(*workers), 60)
    finished.set()
    await watcher

    assert peaks["claimers"] <= 3 and peaks["database"] <= 3, peaks
    assert peaks["database"] == 3, peaks  # the limit was reached: the claims really raced
    assert len(got) == 40 and all(len(names) == 1 for names in got.values())
    assert len({names[0] for names in got.values()}) > 1


async def test_a_renewal_and_a_write_of_one_experts_tasks_never_deadlock(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # The renewal took the expert's rows in scan order and a release or completion in the
    # order given: 22 deadlocks in 40 rounds, each one a stall of deadlock_timeout (1 s).
    store = await make_store(pool_size=2)
    await store.submit([TaskSpec.build("t", [n]) for n in range(300)])
    session = await store.register_expert(ExpertInfo("e"), 60)
    caplog.set_level(logging.WARNING, logger="contend.store.postgres")
    for n in range(40):
        got = await store.claim("e", session, ["default"], Capabilities(), limit=300, lease_ttl=60)
        assert len(got) == 300
        items = sorted(((c.id, c.fence) for c in got), reverse=n % 2 == 0)
        _, released = await asyncio.gather(
            store.renew("e", session, 60, Heartbeat()), store.release("e", items)
        )
        assert released == [None] * 300
    deadlocks = [r for r in caplog.records if "deadlock" in r.getMessage()]
    assert deadlocks == []
