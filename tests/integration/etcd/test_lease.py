"""etcd through a frozen path (packets vanish, no reset) while a rival keeps a direct one: the
frozen expert must stop its task within lease + one heartbeat, before the rival runs it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from contend.testing.etcd_server import EtcdServer
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

pytestmark = pytest.mark.etcd


async def test_a_frozen_path_stops_the_task_before_a_rival_takes_it(store_url: str) -> None:
    await frozen_path_run(store_url, 2379, "etcd")


async def test_an_expert_whose_etcd_is_gone_backs_off_then_comes_back(
    fresh_server: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd killed for longer than the lease, then restarted: the expert stops its task, tries
    for a new session a few times (not 22,402 log lines in 7 s), and opens one once etcd is
    back."""
    effects = SideEffects()
    app = make_app(f"{fresh_server.url}/gone", effects)
    caplog.set_level(logging.INFO, logger="contend")
    try:
        async with expert(app, "gone") as gone:
            handle = await app.submit("work", [60.0])
            await until(lambda: effects.started("gone"), 10, "the first run")
            fresh_server.kill()
            killed_at = time.monotonic()
            caplog.clear()
            try:
                await hold_fault(effects, "gone")
                await until(lambda: time.monotonic() - killed_at > 7.0, 10, "seven seconds")
            finally:
                lines = len(caplog.records)
                fresh_server.start()
            stopped = await stop_time(effects, "gone", killed_at)
            print(f"\netcd killed: stopped after {stopped:.2f}s; {lines} log lines in 7s")
            assert stopped <= STOP_WITHIN
            assert lines <= 40, f"{lines} log lines in 7 s"
            beats = gone.stats.heartbeats
            await until(lambda: gone.stats.heartbeats > beats, 30, "a renewal after the restart")
            assert await asyncio.wait_for(handle.result(), 30) == "gone"
            assert gone.stats.leases_lost == 1
    finally:
        await app.aclose()
