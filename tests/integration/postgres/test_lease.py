"""PostgreSQL faults that make the store hang rather than fail: an expert's path frozen (packets
vanish, no reset) while a rival keeps a direct path, and the server stopped for longer than the
lease. The expert must stop its task within lease + one heartbeat of the fault — not when the
store answers again — and two runs of a task must never overlap."""

from __future__ import annotations

import asyncio
import time

import pytest

from contend.domain.task import TaskState
from contend.testing.pg_cluster import Cluster
from tests.integration.lease_faults import (
    STOP_WITHIN,
    SideEffects,
    expert,
    frozen_path_run,
    hold_fault,
    make_app,
    stop_time,
    until,
)

pytestmark = pytest.mark.postgres


async def test_a_frozen_path_stops_the_task_before_a_rival_takes_it(pg_url: str) -> None:
    await frozen_path_run(pg_url, 5432, "PostgreSQL")


async def test_a_stopped_server_stops_the_task_within_lease_and_one_beat(
    cluster: Cluster,
) -> None:
    effects = SideEffects()
    app = make_app(cluster.url, effects)
    try:
        async with expert(app, "alone") as alone:
            handle = await app.submit("work", [60.0])
            await until(lambda: effects.started("alone"), 10, "the first run")
            await asyncio.to_thread(cluster.stop_now)  # pg_ctl -m immediate stop
            stopped_at = time.monotonic()
            try:
                await hold_fault(effects, "alone")
            finally:
                await asyncio.to_thread(cluster.start_again)
            stopped = await stop_time(effects, "alone", stopped_at)
            print(f"\nPostgreSQL, server stopped: the task stopped after {stopped:.2f}s")
            assert stopped <= STOP_WITHIN, f"ran {stopped:.2f}s after the server stopped"
            # the server is back: a new session, and the task run again to its end
            assert await asyncio.wait_for(handle.result(), 60) == "alone"
            assert alone.stats.leases_lost >= 1
        task = await (await app.store()).get(handle.id, history=True)
        assert task.state == TaskState.SUCCEEDED and task.attempts == 2
        assert [e.fence for e in task.history if e.event == "succeeded"] == [2]
    finally:
        await app.aclose()
