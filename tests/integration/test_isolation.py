"""Tasks run in a process of their own (``isolation="process"``) on a real SQLite store: JSON in
and out, errors and checkpoints across the pipe, and a kill — not a request — when the run must
stop (a timeout, a lost lease)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contend import App, ConfigError, RetryPolicy, TaskFailed
from tests.integration import isolated_tasks as t
from tests.integration.lease_faults import STOP_WITHIN, expert, until


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    app = App(f"sqlite:///{tmp_path / 'iso.db'}")
    process = app.task(isolation="process")
    process(t.add)
    process(t.add_async)
    app.task(isolation="process", retries=RetryPolicy(dont_retry_on=(t.Unwelcome,)))(t.refuse)
    process(t.not_json)
    process(t.counts)
    app.task(isolation="process", retries=2)(t.resume)
    # 3 s: the child must have started (and written its pid) before the timeout, even on a
    # loaded machine; the test is about the kill, not about how fast a process starts
    app.task(isolation="process", timeout=3.0, retries=0)(t.spin)
    app.task(isolation="process", name="spin_forever")(t.spin)
    yield app
    await app.aclose()


async def test_results_come_back_as_json_from_a_child(app: App) -> None:
    async with expert(app, "iso", concurrency=2):
        assert await asyncio.wait_for((await app.submit("add", [2, 3])).result(), 30) == 5
        got = await asyncio.wait_for((await app.submit("add_async", [1, 1])).result(), 30)
        assert got["sum"] == 2 and got["pid"] != os.getpid()


async def test_progress_reported_in_a_child_is_saved(app: App) -> None:
    async with expert(app, "iso"):
        handle = await app.submit("counts", [3])
        assert await asyncio.wait_for(handle.result(), 30) == 3
        assert await handle.progress() == {"done": 3, "total": 3, "note": "step 3"}


async def test_errors_cross_the_pipe_with_their_type(app: App) -> None:
    async with expert(app, "iso"):
        refused = await app.submit("refuse", [7])
        with pytest.raises(TaskFailed, match="ended failed: Unwelcome: no 7"):
            await asyncio.wait_for(refused.result(), 30)  # not retried: the policy saw its type
        assert "in refuse" in (await refused.get()).error["traceback"]
        bad = await app.submit("not_json")
        with pytest.raises(TaskFailed, match="PayloadError"):
            await asyncio.wait_for(bad.result(), 30)


async def test_a_checkpoint_saved_in_a_child_survives_its_crash(app: App) -> None:
    async with expert(app, "iso"):
        handle = await app.submit("resume")
        got = await asyncio.wait_for(handle.result(), 30)
    assert got == {"state": {"done": 3}, "attempt": 2, "fence": 2}


async def test_a_timeout_kills_the_child(app: App, tmp_path: Path) -> None:
    marker = tmp_path / "timeout.ticks"
    async with expert(app, "iso"):
        handle = await app.submit("spin", [str(marker)])
        with pytest.raises(TaskFailed, match="Timeout"):
            await asyncio.wait_for(handle.result(), 30)
    pid = int(marker.with_suffix(".pid").read_text())
    assert not _alive(pid)


async def test_a_lost_lease_kills_a_child_that_never_checks(app: App, tmp_path: Path) -> None:
    """A sync task that ignores ctx.cancelled, in a child: the lock that freezes the store
    ends the lease, and the child is killed by the deadline, not left running."""
    marker = tmp_path / "lease.ticks"
    path = Path(app.store_url.removeprefix("sqlite:///"))
    async with expert(app, "iso") as e:
        await app.submit("spin_forever", [str(marker)])
        await until(lambda: marker.exists() and marker.stat().st_size > 0, 30, "the child")
        pid = int(marker.with_suffix(".pid").read_text())
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        locked_at = time.monotonic()
        try:
            await until(lambda: not _alive(pid), STOP_WITHIN + 5, "the child's death")
            killed = time.monotonic() - locked_at
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        last_tick = float(marker.read_text().split()[-1]) - locked_at
        print(f"\nprocess isolation: the child's last side effect {last_tick:.2f}s into the lock")
        assert killed <= STOP_WITHIN and last_tick <= STOP_WITHIN
        assert e.stats.leases_lost == 1 and e.stats.tasks_done == 0


def test_only_importable_functions_may_run_in_a_process() -> None:
    app = App("memory://")

    def local() -> None: ...

    with pytest.raises(ConfigError, match="module-level function"):
        app.task(isolation="process")(local)
    with pytest.raises(ConfigError, match="None, 'thread' or 'process'"):
        app.task(isolation="threads")(t.add)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_child_over_its_memory_limit_is_killed_and_the_expert_lives_on(
    tmp_path: Path,
) -> None:
    app = App(f"sqlite:///{tmp_path / 'mem.db'}")
    app.task(isolation="process", memory_limit="100MiB", retries=3)(t.hog)
    try:
        async with expert(app, "frugal", concurrency=2):
            greedy = await app.submit("hog", [400, 30.0])
            started = time.monotonic()
            with pytest.raises(TaskFailed, match="MemoryLimitExceeded"):
                await asyncio.wait_for(greedy.result(), 30)
            assert time.monotonic() - started < 10  # killed, not left to hold it for 30 s
            task = await greedy.get()
            assert (task.state.value, task.attempts) == ("failed", 1)  # not retried
            assert "over its memory_limit of 100 MiB" in task.error["message"]
            # the same expert goes on running tasks within the limit
            modest = await app.submit("hog", [10, 0.0])
            assert await asyncio.wait_for(modest.result(), 30) == 10
    finally:
        await app.aclose()


def test_a_memory_limit_needs_a_process_and_a_sane_size() -> None:
    app = App("sqlite:///unused.db")
    with pytest.raises(ConfigError, match="needs isolation='process'"):
        app.task(memory_limit="1GiB")(t.add)
    with pytest.raises(ConfigError, match="size like '512MiB'"):
        app.task(isolation="process", memory_limit="lots")(t.add)
    with pytest.raises(ConfigError, match="at least 16 MiB"):
        app.task(isolation="process", memory_limit=1000)(t.add)
    app.task(isolation="process", memory_limit="1.5GB")(t.add)
    assert app.tasks["add"].memory_limit == 1_500_000_000
