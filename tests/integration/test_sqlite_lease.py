"""SQLite: another connection holds the write lock for longer than the lease. The expert's
renewals cannot land; it must stop its task by its deadline, commit nothing of it, and run it
again once the lock is gone."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from contend.domain.task import TaskState
from tests.integration.lease_faults import (
    STOP_WITHIN,
    SideEffects,
    expert,
    hold_fault,
    make_app,
    stop_time,
    until,
)


async def test_a_held_write_lock_stops_the_task_within_lease_and_one_beat(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.db"
    effects = SideEffects()
    app = make_app(f"sqlite:///{path}", effects)
    try:
        async with expert(app, "a") as a:
            handle = await app.submit("work", [60.0])
            await until(lambda: effects.started("a"), 10, "the first run")
            lock = sqlite3.connect(path, isolation_level=None)
            lock.execute("BEGIN IMMEDIATE")  # another process's long write transaction
            locked_at = time.monotonic()
            try:
                await hold_fault(effects, "a")
            finally:
                lock.execute("ROLLBACK")
                lock.close()
            stopped = await stop_time(effects, "a", locked_at)
            print(f"\nSQLite, write lock held: stopped {stopped:.2f}s after the lock was taken")
            assert stopped <= STOP_WITHIN, f"ran {stopped:.2f}s into the lock"
            assert a.stats.leases_lost == 1 and a.stats.tasks_done == 0
            # the lock is gone: a new session, the task back to pending, run again to the end
            assert await asyncio.wait_for(handle.result(), 30) == "a"
        task = await handle.get()
        store = await app.store()
        events = (await store.get(handle.id, history=True)).history
        assert task.state == TaskState.SUCCEEDED and task.attempts == 2
        assert [e.fence for e in events if e.event == "succeeded"] == [2]
        first_stop = effects.stopped("a")
        assert first_stop is not None
        assert max(t for _, fence, t in effects.ticks if fence == 1) <= first_stop
    finally:
        await app.aclose()
