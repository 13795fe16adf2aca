"""A real PostgreSQL restart in the middle of a run: experts reconnect with back-off, follow the
lease rules, and nothing is lost or committed twice."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from contend.domain.task import TaskSpec, TaskState
from contend.store.registry import open_store
from contend.testing.pg_cluster import Cluster
from tests.acceptance.conftest import Experts, wait_until


@pytest.mark.postgres
async def test_a_restart_mid_run_loses_nothing_and_commits_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    store = await open_store(cluster.url)
    experts = Experts(cluster.url, tmp_path)
    try:
        specs = [TaskSpec.build("slow", [0.05], max_attempts=10) for _ in range(150)]
        await store.submit(specs)
        for name in ("one", "two"):
            experts.start(name, lease=3.0, concurrency=4)

        async def a_third_done() -> bool:
            stats = await store.stats()
            return stats.counts.get("default", {}).get("succeeded", 0) >= 50

        await wait_until(a_third_done, timeout=60, what="a third of the work", watch=experts)
        cluster.restart()  # every connection drops; the server is back a moment later

        async def all_done() -> bool:
            try:
                stats = await store.stats()
            except Exception:  # this test's own store reconnects too
                return False
            return stats.counts.get("default", {}).get("succeeded", 0) == len(specs)

        await wait_until(all_done, timeout=90, what="every task after the restart", watch=experts)
        for spec in specs:
            task = await store.get(spec.id, history=True)
            assert task.state == TaskState.SUCCEEDED
            assert [e.event for e in task.history].count("succeeded") == 1, task.history
        experts.check_alive()  # both experts rode out the restart...
        logs = experts.log("one") + experts.log("two")
        assert "LISTEN connection lost" in logs  # ...which really happened mid-run
        assert all(p.poll() is None for p in experts.procs.values())
    finally:
        experts.stop_all()
        await store.close()


@pytest.mark.postgres
async def test_the_store_is_back_within_a_second_of_the_server(cluster: Cluster) -> None:
    """The pool replaces a lost connection with back-off. psycopg_pool's own waits 1, 2, 4 s
    and on between attempts: once every connection of the pool had been lost in an outage of
    4 s, the store's calls came back seconds after the server did (attempts at 0, 1, 3 and
    7 s), and with them the experts' sessions."""
    store = await open_store(f"{cluster.url}?pool_size=2")
    try:
        await asyncio.gather(*(store.list_experts() for _ in range(4)))  # two connections
        cluster.stop_now()
        down = time.monotonic()
        # calls that retry while the server is down: the pool's two connections are found
        # broken, and their replacements are what the calls wait for
        calls = [asyncio.create_task(store.list_experts()) for _ in range(4)]
        done, _ = await asyncio.wait(calls, timeout=4.0 - (time.monotonic() - down))
        assert not done  # the outage: 4 s
        await asyncio.to_thread(cluster.start_again)  # returns once it takes connections
        back = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*calls), 30)
        assert time.monotonic() - back < 1.5, time.monotonic() - back
    finally:
        await store.close()
