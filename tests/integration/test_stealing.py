"""Work stealing (seed 003): prefetched, unstarted tasks move to an idle expert by a fenced
transfer, and the first owner never starts them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from contend import App, TaskContext
from tests.integration.test_runtime import eventually, expert


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
    return len(e.parts.claimer.prefetched) >= n  # type: ignore[attr-defined]


async def _no_prefetch(e: object) -> bool:
    return len(e.parts.claimer.prefetched) == 0  # type: ignore[attr-defined]


async def _beats(e: object, n: int) -> bool:
    return e.stats.heartbeats >= n  # type: ignore[attr-defined]


async def _stole(e: object, n: int) -> bool:
    return e.stats.stolen >= n  # type: ignore[attr-defined]
