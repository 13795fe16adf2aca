"""The store contract: what each dependency edge's ``if_failed`` choice does to the task waiting
on it when the dependency does not succeed: ``fail`` (dead), ``cancel`` (cancelled, its
history saying why) or ``run`` (the edge counts as done). Each holds whether the dependency
ends while the task waits or had ended before the task was submitted.
"""

from __future__ import annotations

import pytest

from contend.domain.task import TaskState
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import CANCELLED, DEAD, FAILED, P, W, join, spec, state_of

#: What each choice makes of the waiting task.
BECOMES = {"fail": DEAD, "cancel": CANCELLED, "run": P}


async def _end(harness: Harness, task_id: str, final: TaskState) -> None:
    """End task *task_id* (pending) in *final*: dead by its owner, or cancelled by hand."""
    s = harness.store
    if final == CANCELLED:
        await s.cancel(task_id)
        return
    e = await join(harness, "ender")
    c = await e.claim_one(task_ids=[task_id])
    assert await e.write("fail", task_id, c.fence, final_state=final) is None


@pytest.mark.parametrize("final", [DEAD, CANCELLED])
@pytest.mark.parametrize("choice", ["fail", "cancel", "run"])
async def test_a_dependency_ending_while_its_dependant_waits(
    harness: Harness, choice: str, final: TaskState
) -> None:
    s = harness.store
    a = spec("a")
    b = spec("b", depends_on=[a.id], if_failed=[choice])
    await s.submit([a, b])
    assert await state_of(s, b.id) == W
    await _end(harness, a.id, final)
    task = await s.get(b.id, history=True)
    assert task.state == BECOMES[choice]
    assert task.if_failed_of(a.id) == choice
    (line,) = task.history
    assert a.id in (line.detail or "")
    if choice == "fail":
        assert line.event == "dead"
        assert task.error is not None and a.id in str(task.error)
    elif choice == "cancel":
        assert line.event == "cancelled"
        assert "if_failed=cancel" in (line.detail or "") and task.error is None
    else:
        assert line.event == "ready"
        assert task.error is None


@pytest.mark.parametrize("final", [DEAD, CANCELLED])
@pytest.mark.parametrize("choice", ["fail", "cancel", "run"])
async def test_a_dependency_that_had_ended_when_its_dependant_was_submitted(
    harness: Harness, choice: str, final: TaskState
) -> None:
    s = harness.store
    a = spec("a")
    await s.submit([a])
    await _end(harness, a.id, final)
    b = spec("b", depends_on=[a.id], if_failed=[choice])
    await s.submit([b])
    task = await s.get(b.id, history=True)
    assert task.state == BECOMES[choice]
    assert task.if_failed_of(a.id) == choice
    if choice == "cancel":
        (line,) = task.history
        assert line.event == "cancelled" and a.id in (line.detail or "")
    if choice == "fail":
        assert task.error is not None and a.id in str(task.error)
        (line,) = task.history
        assert line.event == "dead" and a.id in (line.detail or "")
    if choice == "run":
        assert task.history == ()
        e = await join(harness)
        assert (await e.claim_one()).id == b.id


async def test_a_run_edge_that_failed_and_one_that_succeeded_let_the_task_run(
    harness: Harness,
) -> None:
    s = harness.store
    a, ok = spec("a"), spec("ok")
    b = spec("b", depends_on=[a.id, ok.id], if_failed=["run", "fail"])
    await s.submit([a, ok, b])
    await _end(harness, a.id, FAILED)
    assert await state_of(s, b.id) == W
    e = await join(harness)
    c = await e.claim_one(task_ids=[ok.id])
    assert await e.write("complete", ok.id, c.fence) is None
    task = await s.get(b.id, history=True)
    assert task.state == P
    assert task.if_failed == ("run", "fail")
    assert [(x.event, ok.id in (x.detail or "")) for x in task.history] == [("ready", True)]
    assert (await e.claim_one()).id == b.id


async def test_a_run_edge_that_ended_last_makes_the_task_ready(harness: Harness) -> None:
    s = harness.store
    a, ok = spec("a"), spec("ok")
    b = spec("b", depends_on=[ok.id, a.id], if_failed=["fail", "run"])
    await s.submit([a, ok, b])
    e = await join(harness)
    c = await e.claim_one(task_ids=[ok.id])
    assert await e.write("complete", ok.id, c.fence) is None
    assert await state_of(s, b.id) == W
    await _end(harness, a.id, DEAD)
    task = await s.get(b.id, history=True)
    assert task.state == P
    (line,) = task.history
    assert line.event == "ready" and "if_failed=run" in (line.detail or "")


async def test_a_cancelled_dependant_settles_its_own_dependants(harness: Harness) -> None:
    s = harness.store
    a = spec("a")
    b = spec("b", depends_on=[a.id], if_failed=["cancel"])
    c = spec("c", depends_on=[b.id])
    d = spec("d", depends_on=[b.id], if_failed=["run"])
    await s.submit([a, b, c, d])
    await _end(harness, a.id, DEAD)
    assert await state_of(s, b.id) == CANCELLED
    assert await state_of(s, c.id) == DEAD
    assert await state_of(s, d.id) == P


@pytest.mark.parametrize("order", ["dependency-first", "dependent-first"])
async def test_a_dependency_born_cancelled_in_the_same_batch(harness: Harness, order: str) -> None:
    s = harness.store
    f = spec("f")
    await s.submit([f])
    await _end(harness, f.id, FAILED)
    a = spec("a", depends_on=[f.id], if_failed=["cancel"])  # cancelled at birth
    b = spec("b", depends_on=[a.id], if_failed=["run"])
    c = spec("c", depends_on=[a.id])
    await s.submit([a, b, c] if order == "dependency-first" else [c, b, a])
    assert await state_of(s, a.id) == CANCELLED
    assert await state_of(s, b.id) == P
    assert await state_of(s, c.id) == DEAD


async def test_edges_without_a_choice_fail(harness: Harness) -> None:
    s = harness.store
    a = spec("a")
    b = spec("b", depends_on=[a.id])
    await s.submit([a, b])
    task = await s.get(b.id)
    assert task.if_failed == () and task.if_failed_of(a.id) == "fail"
    assert task.to_json()["if_failed"] == ["fail"]


async def test_dependants_lists_the_tasks_that_name_a_task_before_and_after_it_ends(
    harness: Harness,
) -> None:
    """A diamond a -> (b, c) -> d, and e on both a and d: a task's dependants are found
    whatever their state, and still after the dependency ended and its edges were settled."""
    s = harness.store
    a = spec("a")
    b = spec("b", depends_on=[a.id], if_failed=["run"])
    c = spec("c", depends_on=[a.id])
    d = spec("d", depends_on=[b.id, c.id], if_failed=["fail", "cancel"])
    e = spec("e", depends_on=[d.id, a.id])
    await s.submit([a, b, c, d, e])
    found = await s.dependants(a.id)
    assert [t.id for t in found] == sorted([b.id, c.id, e.id])
    assert {t.id: t.state for t in found} == {b.id: W, c.id: W, e.id: W}
    assert {t.id: t.if_failed_of(a.id) for t in found} == {b.id: "run", c.id: "fail", e.id: "fail"}
    assert [t.id for t in await s.dependants(a.id, limit=2)] == sorted([b.id, c.id, e.id])[:2]
    assert [t.id for t in await s.dependants(d.id)] == [e.id]
    assert await s.dependants(e.id) == []
    assert await s.dependants("no-such-task") == []
    ex = await join(harness)
    ca = await ex.claim_one(task_ids=[a.id])
    assert await ex.write("complete", a.id, ca.fence) is None
    after = await s.dependants(a.id)
    assert {t.id: t.state for t in after} == {b.id: P, c.id: P, e.id: W}
    assert {t.id for t in await s.dependants(c.id)} == {d.id}
    assert (await s.dependants(c.id))[0].if_failed_of(c.id) == "cancel"
