"""Retention: the domain's checks, and an expert's housekeeping pruning as it goes."""

from __future__ import annotations

from typing import Any

import pytest

from contend import Expert, ExpertConfig
from contend.domain.retention import check_prune, check_retention
from contend.errors import ConfigError, TaskNotFound
from contend.runtime.housekeeping import PRUNE_EVERY
from contend.testing import FakeClock
from tests.unit.fakes import app_on, faulty_memory, running


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "7d", True])
def test_a_retention_is_seconds_or_none(bad: object) -> None:
    with pytest.raises(ConfigError, match="retention"):
        check_retention(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="retention"):
        ExpertConfig(retention=bad).validate()  # type: ignore[arg-type]
    assert check_retention(None) is None and check_retention(60) == 60.0


def test_a_prune_pass_is_bounded() -> None:
    assert check_prune(5.0, 10, 3) == (5.0, 10, 3)
    for args in [(5.0, 0, 3), (5.0, 10**6, 3), (5.0, 10, 0), (float("nan"), 10, 3)]:
        with pytest.raises(ConfigError, match="prune"):
            check_prune(*args)


def pruning_expert(retention: float, lease_ttl: float) -> tuple[FakeClock, Any, Any, Expert]:
    """An expert with *retention* on a memory store and a fake clock, and its app's ``job``."""
    clock = FakeClock(1_000.0)
    store = faulty_memory(clock)
    app = app_on(store)

    @app.task
    async def job() -> str:
        return "ok"

    expert = Expert(app, name="r", lease_ttl=lease_ttl, clock=clock, retention=retention)
    return clock, store, job, expert


async def test_an_expert_prunes_finished_tasks_past_the_retention() -> None:
    clock, store, job, expert = pruning_expert(30.0, lease_ttl=6.0)
    async with running(expert, clock):
        first = await expert.app.submit(job)
        assert await clock.run_until(lambda: expert.stats.tasks_done == 1, limit=10)
        await clock.run(PRUNE_EVERY + 31.0)  # past the retention and the next pass
        second = await expert.app.submit(job)
        assert await clock.run_until(lambda: expert.stats.tasks_done == 2, limit=10)
        await clock.run(2.0)
    with pytest.raises(TaskNotFound):
        await store.get(first.id)
    assert (await store.get(second.id)).result == "ok"  # young: kept


async def test_a_short_retention_is_pruned_within_a_quarter_of_it_more() -> None:
    """Rounds came 30 s apart once caught up, whatever the retention: a 20 s retention at
    10,000 tasks/s held 720,000 rows. Now a round is due within a quarter of the retention."""
    clock, store, job, expert = pruning_expert(8.0, lease_ttl=3.0)
    async with running(expert, clock):
        first = await expert.app.submit(job)
        assert await clock.run_until(lambda: expert.stats.tasks_done == 1, limit=10)
        # past the retention (8 s), a quarter of it (2 s) and a heartbeat (1 s), well short
        # of PRUNE_EVERY
        await clock.run(8.0 + 2.0 + 1.0 + 1.0)
        assert PRUNE_EVERY > 8.0 + 2.0 + 1.0 + 1.0
        with pytest.raises(TaskNotFound):
            await store.get(first.id)
