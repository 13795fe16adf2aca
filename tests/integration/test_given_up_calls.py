"""A store call the runtime gave up on (``bounded()`` past its deadline) must stop: it may not
apply its write later, once the caller has moved on (stopped the task, dropped its result,
opened a new session). SQLite: the write lock held by another connection while an expert
commits; the lock is released after the caller gave up."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.runtime.clock import SystemClock, bounded, settle_strays
from contend.store.port import Completion, ExpertInfo
from contend.store.sqlite import SQLiteStore


async def test_a_given_up_sqlite_commit_never_lands(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    clock = SystemClock()
    try:
        session = await store.register_expert(ExpertInfo("e"), 60)
        (task,) = await store.submit([TaskSpec.build("echo", [1])])
        (claimed,) = await store.claim(
            "e", session, ["default"], Capabilities(), limit=1, lease_ttl=60
        )
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # another process's long write transaction
        try:
            with pytest.raises(TimeoutError):
                await bounded(
                    clock, store.complete("e", [Completion(task.id, claimed.fence, "1")]), 0.3
                )
        finally:
            lock.execute("ROLLBACK")  # the lock is free again: a call still trying would land
            lock.close()
        assert await settle_strays(clock, 5.0) == 0  # the given-up call has ended
        after = await store.get(task.id, history=True)
        assert after.state == TaskState.RUNNING, "the write landed after its caller gave up"
        assert "succeeded" not in [e.event for e in after.history]
    finally:
        await store.close()
