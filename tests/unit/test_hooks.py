"""Hooks: every moment reaches every hook that wants it; a hook that raises breaks nothing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from contend import Expert, FencedOut, TaskState
from contend.runtime.hooks import MOMENTS, ExpertStats, Hook, Hooks
from contend.store.port import Claimed, Completion, Heartbeat
from contend.testing import FakeClock
from tests.unit.fakes import Recorder, app_on, faulty_memory, running

CLAIMED = Claimed("t", "k", "default", [], {}, 1, 1, 3, None, None, 0.0)


_DONE = Completion("t", 1, "null")
#: Plausible arguments for each moment.
ARGS: dict[str, tuple[Any, ...]] = {
    "on_claimed": ("e", [CLAIMED], 2),
    "on_stolen": ("e", "victim", [CLAIMED]),
    "on_taken_over": ("e", ["t"]),
    "before_execute": ("e", CLAIMED),
    "after_execute": ("e", CLAIMED, _DONE, 0.5, None),
    "on_abandoned": ("e", CLAIMED, "why"),
    "on_committed": ("e", _DONE),
    "on_fenced_out": ("e", _DONE, FencedOut("t", 1, "refused")),
    "on_heartbeat": ("e", Heartbeat(), 3),
    "on_lease_lost": ("e", "why", 1, 2),
    "on_renewal": ("e", 0.01, 9.5),
    "on_expired": ("e", 2),
}


class Claims(Hook):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_claimed(self, expert: str, tasks: Any, attempted: int) -> None:
        self.seen.append(attempted)


class Broken(Hook):
    pass


def _raise(self: Broken, *args: Any) -> None:
    raise RuntimeError("a broken hook")


for _moment in MOMENTS:
    setattr(Broken, _moment, _raise)


def test_every_moment_reaches_every_hook_that_overrides_it_in_order() -> None:
    clock = FakeClock(0.0)
    first, second, claims = Recorder(clock), Recorder(clock), Claims()
    hooks = Hooks([first, Hook(), claims, second])
    assert set(MOMENTS) == {n for n in vars(Hook) if not n.startswith("_")}
    for moment in MOMENTS:
        getattr(hooks, moment)(*ARGS[moment])
    assert [m for _, m, _ in first.calls] == list(MOMENTS)
    assert [(m, a) for _, m, a in second.calls] == [(m, ARGS[m]) for m in MOMENTS]
    assert claims.seen == [2]


def test_a_hook_that_raises_is_logged_and_the_next_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    after = Recorder(FakeClock(0.0))
    hooks = Hooks([Broken(), after])
    with caplog.at_level(logging.ERROR, logger="contend.hooks"):
        for _ in range(3):
            hooks.on_claimed("e", [CLAIMED], 1)
    assert len(after.of("on_claimed")) == 3
    errors = [r for r in caplog.records if r.name == "contend.hooks"]
    assert len(errors) == 3 and "Broken.on_claimed raised" in errors[0].getMessage()
    assert [bool(r.exc_info) for r in errors] == [True, False, False]  # one traceback


def test_stats_count_what_the_moments_say() -> None:
    stats = ExpertStats()
    hooks = Hooks([stats])
    for moment in MOMENTS:
        getattr(hooks, moment)(*ARGS[moment])
    assert stats == ExpertStats(
        claim_attempts=2,
        claims_won=1,
        tasks_done=1,
        tasks_failed=0,
        fenced_out=1,
        leases_lost=1,
        heartbeats=1,
        stolen=1,
        stolen_from_me=1,
    )


async def test_a_broken_hook_never_stops_the_expert(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    seen = Recorder(clock)

    @app.task
    async def double(x: int) -> int:
        await clock.sleep(1.0)
        return 2 * x

    expert = Expert(app, name="h", lease_ttl=3.0, clock=clock, hooks=[Broken(), seen])
    with caplog.at_level(logging.ERROR, logger="contend.hooks"):
        async with running(expert, clock):
            handles = [await app.submit(double, [n]) for n in range(5)]
            assert await clock.run_until(lambda: expert.stats.tasks_done == 5, limit=30)
            await clock.run(1.0)  # a heartbeat publishes the counters
    for n, h in enumerate(handles):
        task = await store.get(h.id)
        assert (task.state, task.result) == (TaskState.SUCCEEDED, 2 * n)
    assert len(seen.of("after_execute")) == len(seen.of("on_committed")) == 5
    assert sum(len(tasks) for _, tasks, _ in seen.of("on_claimed")) == 5
    assert seen.of("on_heartbeat")
    broken = {
        r.getMessage().split(" raised")[0] for r in caplog.records if r.name == "contend.hooks"
    }
    assert {"hook Broken.on_claimed", "hook Broken.after_execute"} <= broken
    (rec,) = await store.list_experts()
    assert (rec.claims_won, rec.tasks_done) == (5, 5)  # ExpertStats, through the heartbeat


async def test_the_moments_of_one_task_in_order() -> None:
    clock = FakeClock(0.0)
    app = app_on(faulty_memory(clock))
    seen = Recorder(clock)

    @app.task
    async def one() -> str:
        await clock.sleep(2.0)
        return "ok"

    expert = Expert(app, name="o", lease_ttl=3.0, clock=clock, hooks=[seen])
    async with running(expert, clock):
        await app.submit(one)
        assert await clock.run_until(lambda: expert.stats.tasks_done == 1, limit=10)
    life = [
        (at, m)
        for at, m, _ in seen.calls
        if m in ("on_claimed", "before_execute", "after_execute", "on_committed")
    ]
    assert [m for _, m in life] == ["on_claimed", "before_execute", "after_execute", "on_committed"]
    assert life[2][0] - life[1][0] == 2.0
    ((_, task, outcome, seconds, error),) = seen.of("after_execute")
    assert (task.type, outcome.result_json, seconds, error) == ("one", '"ok"', 2.0, None)


async def test_hooks_see_no_moment_of_a_stopped_expert_after_run_returns() -> None:
    clock = FakeClock(0.0)
    app = app_on(faulty_memory(clock))
    seen = Recorder(clock)

    @app.task
    async def forever() -> None:
        await asyncio.Event().wait()

    expert = Expert(app, name="s", lease_ttl=3.0, grace=1.0, clock=clock, hooks=[seen])
    async with running(expert, clock):
        await app.submit(forever)
        assert await clock.run_until(lambda: expert.load == 1, limit=5)
    ((_, task, why),) = seen.of("on_abandoned")
    assert task.type == "forever" and "stopped" in why
    count = len(seen.calls)
    await clock.run(10)
    assert len(seen.calls) == count
