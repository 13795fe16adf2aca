"""What a claim and an expiry round read on SQLite, counted in the virtual machine's steps (a
progress handler), not timed: a fair claim and a claim of named ids look tasks up by key,
whatever the backlog ahead of them, and expiry costs the same however many tasks ran."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.port import Completion, ExpertInfo
from contend.store.sqlite import SQLiteStore

T = TypeVar("T")


async def _steps(store: SQLiteStore, call: Awaitable[T]) -> tuple[int, T]:
    """The virtual machine steps *call* takes on the store's connection (to 100), its answer."""
    conn = store._db.conn
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        got = await call
    finally:
        conn.set_progress_handler(None, 0)
    return steps[0] * 100, got


async def _steps_of_a_claim(store: SQLiteStore, session: str, **kw: object) -> tuple[int, list]:
    claim = store.claim("e", session, ["default"], Capabilities(), limit=4, lease_ttl=30, **kw)
    return await _steps(store, claim)


async def _run_to(store: SQLiteStore, session: str, done: int, finished: int) -> int:
    """Submit and complete tasks, 2,000 at a time, until *finished* have run; returns that."""
    while done < finished:
        n = min(2000, finished - done)
        await store.submit([TaskSpec.build("t", ["done", done, i]) for i in range(n)])
        got = await store.claim("e", session, ["default"], Capabilities(), limit=n, lease_ttl=600)
        await store.complete("e", [Completion(c.id, c.fence, "null") for c in got])
        done += len(got)
    return done


async def test_claims_cost_the_same_behind_a_long_backlog(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'cost.db'}")
    await store.open()
    try:
        info = ExpertInfo(id="e", capabilities=Capabilities(), queues=("default",))
        session = await store.register_expert(info, 30)
        costs = {}
        for backlog in (100, 20_000):
            for i in range(0, backlog, 2000):
                n = min(2000, backlog - i)
                await store.submit(
                    [TaskSpec.build("job", [j], limit_key="a", fair=True) for j in range(n)]
                )
            b = await store.submit(
                [TaskSpec.build("job", [j], limit_key="b", fair=True) for j in range(2)]
            )
            fair, got = await _steps_of_a_claim(store, session)
            assert {s.id for s in b} <= {c.id for c in got}  # b's share, behind a's backlog
            deep = [s.id for s in await store.submit([TaskSpec.build("job", [0])])]
            named, got = await _steps_of_a_claim(store, session, task_ids=deep)
            assert [c.id for c in got] == deep
            # a race's claim with a low lane: its named ids top and below
            race = [
                s.id
                for s in await store.submit(
                    [TaskSpec.build("job", [0], priority=p) for p in (5, 5, 5, 1)]
                )
            ]
            laned, got = await _steps_of_a_claim(store, session, task_ids=race, low_lane=1)
            assert {c.id for c in got} == set(race)
            costs[backlog] = (fair, named, laned)
        # 200 times the backlog, about the same work (it was ~100 times more: the claim
        # walked every task ahead of the ones it named)
        for kind in (0, 1, 2):
            assert costs[20_000][kind] < 3 * costs[100][kind] + 20_000, costs
    finally:
        await store.close()


async def test_expiry_costs_the_same_after_many_finished_tasks(tmp_path: Path) -> None:
    """Every expert's housekeeping calls expire() every few seconds. Its look for the auctions
    of tasks no longer pending scanned the whole task table (SQLite chose the tasks as the
    outer loop of the join): a cost that grew with every task ever run, and with a reader
    holding the WAL back, with the WAL too (pickup p99 0.5-0.9 s in a sustained run)."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'expire.db'}")
    await store.open()
    try:
        session = await store.register_expert(ExpertInfo(id="e"), 600)
        costs = {}
        done = 0
        for finished in (100, 20_000):
            done = await _run_to(store, session, done, finished)
            costs[finished], _ = await _steps(store, store.expire())
        assert costs[20_000] <= 2 * costs[100] + 1000, costs
    finally:
        await store.close()


async def test_ageing_costs_the_same_behind_a_long_backlog(tmp_path: Path) -> None:
    """Once a task of another priority than 0 was submitted, expire() also ages the pending
    tasks whose next step is due. SQLite chose the index on (state, queue) for that look and
    read every pending task to find the few due: a cost per expiry round, of every expert,
    that grew with the backlog."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'ageing.db'}")
    await store.open()
    try:
        await store.submit([TaskSpec.build("t", ["high"], priority=5)])  # ageing is on
        costs = {}
        waiting = 0
        for backlog in (100, 20_000):
            while waiting < backlog:
                n = min(2000, backlog - waiting)
                await store.submit([TaskSpec.build("t", [waiting, i]) for i in range(n)])
                waiting += n
            costs[backlog], _ = await _steps(store, store.expire())
        assert costs[20_000] <= 2 * costs[100] + 1000, costs
    finally:
        await store.close()


async def test_stats_read_no_task_past_the_counts(tmp_path: Path) -> None:
    """stats() (the dashboard's and the metrics scrape's read) counts every task once by the
    state index. Its two other reads, the last minute's successes and the oldest due task,
    went by that index too and read every succeeded and every pending task from the table:
    twice the counts' cost, for answers that touch a few rows."""
    now = [1000.0]
    store = SQLiteStore(f"sqlite:///{tmp_path / 'stats.db'}", clock=lambda: now[0])
    await store.open()
    try:
        session = await store.register_expert(ExpertInfo(id="e"), 1e6)
        for b in range(10):
            await store.submit([TaskSpec.build("t", ["waits", b, i]) for i in range(2000)])
            await store.submit([TaskSpec.build("t", ["runs", b, i]) for i in range(2000)])
            got = await store.claim(
                "e", session, ["default"], Capabilities(), limit=2000, lease_ttl=1e5
            )
            await store.complete("e", [Completion(c.id, c.fence, "null") for c in got])
        now[0] += 120  # all of them done over a minute ago

        async def count_all() -> list[tuple[str, str, int]]:
            sql = "SELECT queue, state, count(*) FROM tasks GROUP BY queue, state"
            return store._db.conn.execute(sql).fetchall()

        counts, _ = await _steps(store, count_all())
        cost, stats = await _steps(store, store.stats())
        assert stats.counts["default"] == {"pending": 20_000, "succeeded": 20_000}
        assert stats.oldest_pending_age is not None and stats.oldest_pending_age >= 120
        assert cost <= counts * 1.1 + 1000, (cost, counts)
    finally:
        await store.close()


async def test_pruning_and_cancelling_cost_the_same_beside_many_waiting_tasks(
    tmp_path: Path,
) -> None:
    """A pruned or cancelled task's own dependency edges were deleted by its id, which the
    edges' key (dependency, task) does not lead with: a read of every edge of the store, once
    per task pruned, beside a graph of waiting tasks."""
    now = [1000.0]
    store = SQLiteStore(f"sqlite:///{tmp_path / 'edges.db'}", clock=lambda: now[0])
    await store.open()
    try:
        session = await store.register_expert(ExpertInfo(id="e"), 1e6)
        parent = TaskSpec.build("t", ["parent"], queue="later")  # pending, never run
        await store.submit([parent])
        prune_costs, cancel_costs = {}, {}
        waiting = 0
        for edges in (100, 20_000):
            while waiting < edges:
                n = min(2000, edges - waiting)
                await store.submit(
                    [
                        TaskSpec.build("t", ["child", waiting, i], depends_on=[parent.id])
                        for i in range(n)
                    ]
                )
                waiting += n
            await store.submit([TaskSpec.build("t", ["done", edges, i]) for i in range(200)])
            got = await store.claim(
                "e", session, ["default"], Capabilities(), limit=200, lease_ttl=1e5
            )
            await store.complete("e", [Completion(c.id, c.fence, "null") for c in got])
            child = TaskSpec.build("t", ["cancelled", edges], depends_on=[parent.id])
            await store.submit([child])
            cancel_costs[edges], _ = await _steps(store, store.cancel(child.id))
            now[0] += 10
            prune_costs[edges], pruned = await _steps(store, store.prune(now[0], 1000))
            assert pruned == 201  # the 200 done and the cancelled child
            assert await store.dependants(parent.id, limit=1)  # the waiting graph stays
        assert cancel_costs[20_000] <= 2 * cancel_costs[100] + 1000, cancel_costs
        assert prune_costs[20_000] <= 2 * prune_costs[100] + 1000, prune_costs
    finally:
        await store.close()


async def test_listing_a_common_state_costs_the_same_on_any_size_of_store(
    tmp_path: Path,
) -> None:
    """The dashboard lists tasks of a state, newest first. By the state index, SQLite sorted
    every task in that state to give the first few: 194 ms behind 200,000 succeeded tasks."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'list.db'}")
    await store.open()
    try:
        session = await store.register_expert(ExpertInfo(id="e"), 600)
        costs = {}
        done = 0
        for finished in (5_000, 20_000):
            done = await _run_to(store, session, done, finished)
            listing = store.list_tasks(state=TaskState.SUCCEEDED, newest=True, limit=50)
            costs[finished], listed = await _steps(store, listing)
            assert len(listed) == 50
        assert costs[20_000] <= 1.5 * costs[5_000] + 1000, costs
    finally:
        await store.close()


async def test_a_filtered_listing_is_the_first_tasks_that_match(tmp_path: Path) -> None:
    """Whichever way the listing is read (the first ids in its order, or the state index),
    it is the first *limit* matching tasks in id order."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'mix.db'}")
    await store.open()
    try:
        session = await store.register_expert(ExpertInfo(id="e"), 600)
        for b in range(6):
            await store.submit(
                [TaskSpec.build("t", [b, i], queue=f"q{i % 3}") for i in range(1500)]
            )
            got = await store.claim(
                "e", session, ["q0", "q1"], Capabilities(), limit=1000 + 100 * b, lease_ttl=600
            )
            await store.complete("e", [Completion(c.id, c.fence, "null") for c in got[::2]])
        every = await store.list_tasks(limit=100_000)
        for state in (TaskState.SUCCEEDED, TaskState.RUNNING, TaskState.PENDING, None):
            for queue in ("q0", "q2", None):
                for newest in (False, True):
                    for limit in (1, 40, 700, 5000):
                        want = [
                            t.id
                            for t in sorted(every, key=lambda t: t.id, reverse=newest)
                            if (state is None or t.state == state)
                            and (queue is None or t.queue == queue)
                        ][:limit]
                        got = await store.list_tasks(
                            state=state, queue=queue, newest=newest, limit=limit
                        )
                        assert [t.id for t in got] == want, (state, queue, newest, limit)
    finally:
        await store.close()
