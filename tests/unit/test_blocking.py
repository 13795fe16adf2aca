"""Why a task is not running: each reason, in the order the rule checks them, and read through
the Store port from a real (memory) store with registered experts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contend.domain.blocking import (
    Blocker,
    ExpertFacts,
    PendingFacts,
    count_blockers,
    why_not_running,
)
from contend.domain.limits import KeyState, Rate
from contend.domain.task import Capabilities, Requirements, TaskSpec, TaskState
from contend.store.diagnosis import blocked_counts, diagnose
from contend.store.memory import MemoryStore
from contend.store.port import ExpertInfo, Heartbeat
from contend.testing import FakeClock

NOW = 1000.0
TASK = PendingFacts("t1", "resize", "images", TaskState.PENDING, run_at=NOW - 1)
GPU = Capabilities(frozenset({"gpu"}))


def expert(name: str = "e1", **kw: object) -> ExpertFacts:
    base = ExpertFacts(name, True, frozenset({"images"}), task_types=frozenset({"resize"}))
    return replace(base, **kw)  # type: ignore[arg-type]


def reason(task: PendingFacts, *experts: ExpertFacts) -> Blocker:
    d = why_not_running(task, NOW, list(experts))
    assert d is not None
    assert d.message
    return d.blocker


def test_a_waiting_task_waits_on_its_dependencies() -> None:
    task = replace(TASK, state=TaskState.WAITING, depends_on=("a", "b"))
    d = why_not_running(task, NOW, [expert()])
    assert d is not None and d.blocker == Blocker.WAITING_ON_DEPENDENCIES
    assert "2 dependencies" in d.message


def test_a_task_due_later_names_its_delay_or_its_back_off() -> None:
    later = replace(TASK, run_at=NOW + 30)
    d = why_not_running(later, NOW, [expert()])
    assert d is not None and d.blocker == Blocker.DUE_LATER and "delay" in d.message
    d = why_not_running(replace(later, attempts=1), NOW, [expert()])
    assert d is not None and "back-off" in d.message and "30.0s" in d.message


def test_no_live_expert_on_the_queue() -> None:
    assert reason(TASK) == Blocker.NO_LIVE_EXPERT
    assert reason(TASK, expert(alive=False)) == Blocker.NO_LIVE_EXPERT
    assert reason(TASK, expert(queues=frozenset({"other"}))) == Blocker.NO_LIVE_EXPERT


def test_no_expert_with_the_type_and_an_expert_that_did_not_say_may_run_any() -> None:
    assert reason(TASK, expert(task_types=frozenset({"other"}))) == Blocker.NO_EXPERT_WITH_TYPE
    assert reason(TASK, expert(task_types=frozenset())) == Blocker.CLAIMABLE


def test_no_expert_with_the_requirements() -> None:
    task = replace(TASK, requirements=Requirements.of({"tags": ["gpu"], "resources": {"mem": 8}}))
    d = why_not_running(task, NOW, [expert(capabilities=GPU)])
    assert d is not None and d.blocker == Blocker.NO_EXPERT_WITH_REQUIREMENTS
    assert "gpu, mem=8" in d.message
    enough = Capabilities(frozenset({"gpu"}), {"mem": 16.0})
    assert reason(task, expert(capabilities=enough)) == Blocker.CLAIMABLE


def test_emergency_experts_standing_by_and_joined_in() -> None:
    assert reason(TASK, expert(tier="emergency")) == Blocker.EMERGENCY_STANDBY
    assert reason(TASK, expert(tier="emergency", active=True)) == Blocker.CLAIMABLE


def test_all_capable_experts_busy_counts_only_those_that_could_run_it() -> None:
    busy = expert("busy", load=2, capacity=2)
    idle_but_unable = expert("other", task_types=frozenset({"x"}))
    d = why_not_running(TASK, NOW, [busy, idle_but_unable])
    assert d is not None and d.blocker == Blocker.ALL_CAPABLE_EXPERTS_BUSY
    assert d.experts == ("busy",)
    d = why_not_running(TASK, NOW, [busy, expert("idle")])
    assert d is not None and d.blocker == Blocker.CLAIMABLE and d.experts == ("idle",)


@pytest.mark.parametrize("state", [TaskState.RUNNING, TaskState.CLAIMED, TaskState.SUCCEEDED])
def test_a_task_that_runs_or_ended_has_no_reason(state: TaskState) -> None:
    assert why_not_running(replace(TASK, state=state), NOW, [expert()]) is None


def test_counts_by_queue_and_reason() -> None:
    tasks = [TASK, replace(TASK, id="t2"), replace(TASK, id="t3", run_at=NOW + 5)]
    counts = count_blockers(tasks, NOW, [expert(load=1, capacity=1)])
    assert counts == {
        ("images", Blocker.ALL_CAPABLE_EXPERTS_BUSY): 2,
        ("images", Blocker.DUE_LATER): 1,
    }


async def test_diagnose_and_count_through_the_store_port() -> None:
    clock = FakeClock(NOW)
    store = MemoryStore("memory://", clock=clock)
    await store.open()
    gpu_task = TaskSpec.build("render", requirements=["gpu"], queue="images")
    plain = TaskSpec.build("resize", queue="images")
    later = TaskSpec.build("resize", queue="images", delay=60)
    dependant = TaskSpec.build("resize", queue="images", depends_on=[plain.id])
    await store.submit([gpu_task, plain, later, dependant])
    info = ExpertInfo("e1", queues=("images",), capacity=1, task_types=("render", "resize"))
    session = await store.register_expert(info, 15.0)

    got = {t.id: await diagnose(store, t) for t in await store.list_tasks(limit=10)}
    assert got[gpu_task.id] is not None
    assert got[gpu_task.id].blocker == Blocker.NO_EXPERT_WITH_REQUIREMENTS
    assert got[plain.id] is not None and got[plain.id].blocker == Blocker.CLAIMABLE
    assert got[later.id] is not None and got[later.id].blocker == Blocker.DUE_LATER
    assert got[dependant.id] is not None
    assert got[dependant.id].blocker == Blocker.WAITING_ON_DEPENDENCIES

    await store.renew("e1", session, 15.0, Heartbeat(load=1))  # its one slot is taken
    counts = await blocked_counts(store)
    assert counts.complete
    assert counts.counts == {
        ("images", Blocker.NO_EXPERT_WITH_REQUIREMENTS): 1,
        ("images", Blocker.ALL_CAPABLE_EXPERTS_BUSY): 1,
        ("images", Blocker.DUE_LATER): 1,
        ("images", Blocker.WAITING_ON_DEPENDENCIES): 1,
    }
    sampled = await blocked_counts(store, sample=1)
    assert not sampled.complete
    await store.close()


def test_a_key_at_its_concurrency_limit_or_its_rate_holds_the_task() -> None:
    keyed = replace(TASK, limit_key="tenant:a", concurrency_limit=2)
    full = {"tenant:a": KeyState(held=2)}
    d = why_not_running(keyed, NOW, [expert()], full)
    assert d is not None and d.blocker == Blocker.HELD_BY_CONCURRENCY_LIMIT
    assert "'tenant:a' has 2 task(s) claimed or running, at most 2" in d.message
    assert reason_with(keyed, {"tenant:a": KeyState(held=1)}) == Blocker.CLAIMABLE
    # a rate with no room: one start a second, the last start this moment
    rate = Rate.of("1/s")
    spent = {"tenant:a": KeyState(held=0, rate=rate, tat=NOW + 0.75)}
    d = why_not_running(keyed, NOW, [expert()], spent)
    assert d is not None and d.blocker == Blocker.HELD_BY_RATE_LIMIT
    assert "(1/s); room again in 0.75s" in d.message
    assert reason_with(keyed, {"tenant:a": KeyState(rate=rate, tat=NOW)}) == Blocker.CLAIMABLE
    # no expert could run it anyway: that is said first; an unread key is not diagnosed
    assert reason_with(keyed, full, experts=()) == Blocker.NO_LIVE_EXPERT
    assert reason_with(keyed, {}) == Blocker.CLAIMABLE


def reason_with(
    task: PendingFacts, keys: dict[str, KeyState], experts: tuple[ExpertFacts, ...] | None = None
) -> Blocker:
    d = why_not_running(task, NOW, list((expert(),) if experts is None else experts), keys)
    assert d is not None
    return d.blocker


async def test_a_limit_is_diagnosed_through_the_store_port() -> None:
    clock = FakeClock(NOW)
    store = MemoryStore("memory://", clock=clock)
    await store.open()
    first, second = (
        TaskSpec.build("resize", [n], queue="images", limit_key="k", concurrency_limit=1)
        for n in range(2)
    )
    await store.submit([first, second])
    info = ExpertInfo("e1", queues=("images",), capacity=4, task_types=("resize",))
    session = await store.register_expert(info, 15.0)
    (got,) = await store.claim("e1", session, ["images"], Capabilities(), limit=4, lease_ttl=15)
    waiting = await store.get(second.id if got.id == first.id else first.id)
    d = await diagnose(store, waiting)
    assert d is not None and d.blocker == Blocker.HELD_BY_CONCURRENCY_LIMIT
    counts = await blocked_counts(store)
    assert counts.counts == {("images", Blocker.HELD_BY_CONCURRENCY_LIMIT): 1}
    await store.close()
