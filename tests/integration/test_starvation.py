"""Starvation: a flood of high-priority work does not starve low-priority tasks."""

from __future__ import annotations

from pathlib import Path

from contend import App
from tests.integration.test_runtime import expert


async def test_low_priority_tasks_finish_in_bounded_time_under_a_flood(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'flood.db'}")
    order: list[str] = []

    @app.task
    async def work(tag: str) -> None:
        order.append(tag)

    store = await app.store()
    low = [app.build_spec(work, ["low"], priority=0) for _ in range(5)]
    flood = [app.build_spec(work, ["high"], priority=100) for _ in range(300)]
    await store.submit(low)
    await store.submit(flood)
    async with expert(app, name="only", concurrency=1):
        handles = [app.handle(s.id) for s in low + flood]
        for h in handles:
            await h.result(timeout=60)
    positions = [n for n, tag in enumerate(order) if tag == "low"]
    # one claim in ten goes to the longest-waiting tasks: the 5 low ones are done within the
    # first 50 or so runs, not after the 300 high-priority ones
    assert len(positions) == 5
    assert max(positions) < 60, positions
