"""Retention on the SQL stores: a pass checks histories against the cap at most once in
``TRIM_EVERY`` seconds. That check cost 14 of a pass's 35 ms on PostgreSQL, and a store that is
behind runs passes back to back, so one expert pruned no faster than it finished tasks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contend.domain.retention import TRIM_EVERY
from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import ExpertInfo, Store
from contend.store.postgres import retention as postgres_retention
from contend.store.registry import open_store
from contend.store.sqlite import retention as sqlite_retention
from contend.testing.postgres import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        s = await open_store(f"sqlite:///{tmp_path / 'trim.db'}")
        yield s
        await s.close()
        return
    async with fresh_database() as url:
        s = await open_store(url)
        yield s
        await s.close()


async def bounce(store: Store, task_id: str, session: str, times: int) -> None:
    """Claim and release the task *times* times: two history lines each."""
    for _ in range(times):
        (c,) = await store.claim(
            "e", session, ["default"], Capabilities(), limit=1, lease_ttl=60, task_ids=[task_id]
        )
        await store.release("e", [(c.id, c.fence)])


async def lines(store: Store, task_id: str) -> int:
    return len((await store.get(task_id, history=True)).history)


async def test_histories_are_checked_against_the_cap_once_a_second(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [time.monotonic()]
    for module in (sqlite_retention, postgres_retention):
        monkeypatch.setattr(module, "monotonic", lambda: now[0])
    (t,) = await store.submit([TaskSpec.build("job")])
    session = await store.register_expert(ExpertInfo("e"), 60)
    await bounce(store, t.id, session, 10)  # 21 lines with "submitted"
    await store.prune(await store.now() - 3600, keep_events=5)
    assert await lines(store, t.id) == 5  # the first line and the newest four

    await bounce(store, t.id, session, 10)
    await store.prune(await store.now() - 3600, keep_events=5)  # within the second: not checked
    assert await lines(store, t.id) == 25

    now[0] += TRIM_EVERY
    await store.prune(await store.now() - 3600, keep_events=5)
    assert await lines(store, t.id) == 5
