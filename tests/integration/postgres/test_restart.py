"""A real PostgreSQL restart in the middle of a run: experts reconnect with back-off, follow the
lease rules, and nothing is lost or committed twice."""

from __future__ import annotations

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
