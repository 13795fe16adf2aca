"""Work stealing (seed 003): prefetched, unstarted tasks move to an idle expert by a fenced
transfer, and the first owner never starts them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contend import App, Capabilities, TaskContext, TaskState
from contend.domain.task import TaskSpec
from contend.errors import LeaseLost
from contend.store.port import ExpertInfo, Store
from contend.store.registry import make_store
from contend.testing import FakeClock
from tests.integration.test_runtime import eventually, expert


@pytest.fixture(params=["memory", "sqlite"])
async def store_and_clock(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Store, FakeClock]]:
    clock = FakeClock()
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    store = make_store(url, clock=clock)
    await store.open()
    yield store, clock
    await store.close()


async def test_steal_takes_only_unstarted_tasks_and_fences_out_the_victim(
    store_and_clock: tuple[Store, FakeClock],
) -> None:
    store, clock = store_and_clock
    await store.submit([TaskSpec.build("t", priority=p) for p in (1, 2, 3, 4)])
    v = await store.register_expert(ExpertInfo("victim"), 30)
    t = await store.register_expert(ExpertInfo("thief"), 30)
    running = await store.claim("victim", v, ["default"], Capabilities(), limit=1, lease_ttl=30)
    ahead = await store.claim(
        "victim", v, ["default"], Capabilities(), limit=3, lease_ttl=30, start=False
    )
    stolen = await store.steal(
        "thief", t, "victim", ["default"], Capabilities(), limit=2, lease_ttl=30
    )
    assert [c.priority for c in stolen] == [3, 2]  # the best of the unstarted ones
    assert running[0].id not in {c.id for c in stolen}
    for c in stolen:
        task = await store.get(c.id)
        assert (task.owner, task.state, task.fence, task.attempts) == (
            "thief",
            TaskState.RUNNING,
            2,
            1,
        )
    results = await store.start("victim", [(c.id, c.fence) for c in ahead])
    started = [c for c, r in zip(ahead, results, strict=True) if r is None]
    assert [c.priority for c in started] == [1]  # the one left to it
    assert (
        await store.steal("thief", t, "victim", ["default"], Capabilities(), limit=5, lease_ttl=30)
        == []
    )
    clock.advance(31)
    with pytest.raises(LeaseLost):
        await store.steal("thief", t, "victim", ["default"], Capabilities(), limit=1, lease_ttl=30)


async def test_an_idle_expert_steals_prefetched_work(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'steal.db'}")
    release = asyncio.Event()
    starts: list[tuple[str, str]] = []

    @app.task
    async def job(ctx: TaskContext) -> str:
        starts.append((ctx.task_id, ctx.expert))
        if ctx.expert == "hoarder":
            await release.wait()
        return ctx.expert

    handles = [await app.submit(job) for _ in range(4)]
    async with expert(app, name="hoarder", concurrency=1, prefetch=3, lease_ttl=0.9) as hoarder:
        await eventually(lambda: _prefetched(hoarder, 3))
        beats = hoarder.stats.heartbeats
        await eventually(lambda: _beats(hoarder, beats + 1))  # it published its prefetch
        async with expert(app, name="idle", concurrency=4, lease_ttl=0.9) as idle:
            await eventually(lambda: _stole(idle, 3))
            owners = [await h.result(timeout=10) for h in handles[1:]]
            release.set()
            owners.insert(0, await handles[0].result(timeout=10))
        await eventually(lambda: _no_prefetch(hoarder))
    assert owners.count("idle") == 3
    assert len(starts) == 4 and len({tid for tid, _ in starts}) == 4  # each started once
    store = await app.store()
    for h in handles:
        task = await store.get(h.id, history=True)
        events = [(e.event, e.expert) for e in task.history]
        if ("stolen", "idle") in events:
            assert task.result == "idle" and task.fence == 2


async def _prefetched(e: object, n: int) -> bool:
    return len(e._prefetched) >= n  # type: ignore[attr-defined]


async def _no_prefetch(e: object) -> bool:
    return len(e._prefetched) == 0  # type: ignore[attr-defined]


async def _beats(e: object, n: int) -> bool:
    return e.stats.heartbeats >= n  # type: ignore[attr-defined]


async def _stole(e: object, n: int) -> bool:
    return e.stats.stolen >= n  # type: ignore[attr-defined]
