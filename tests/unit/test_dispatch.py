"""The rules of central queues (``contend.domain.dispatch``): who may lead, how the term grows,
why an assignment is refused, and the leader's plan."""

from __future__ import annotations

from contend.domain.dispatch import (
    Leadership,
    Worker,
    assign_refusal,
    assigned_detail,
    decide_lead,
    free_slots,
    plan,
    term_of,
)
from contend.domain.scoring import ExpertView, TaskView
from contend.domain.task import Capabilities, Requirements


def held_by(holder: str, term: int = 3, deadline: float = 110.0) -> Leadership:
    return Leadership("q", holder, f"s-{holder}", term, deadline)


def test_lead_renews_takes_over_or_waits() -> None:
    first = decide_lead(None, "a", "s-a", 100.0, 10.0, holder_live=False)
    assert first is not None and first.term == 1 and first.taken
    mine = decide_lead(held_by("a"), "a", "s-a", 100.0, 10.0, holder_live=True)
    assert mine is not None and (mine.term, mine.deadline, mine.taken) == (3, 110.0, False)
    assert decide_lead(held_by("a"), "b", "s-b", 100.0, 10.0, holder_live=True) is None
    # lapsed, or its holder's session gone: the next term
    lapsed = decide_lead(held_by("a", deadline=99.0), "b", "s-b", 100.0, 10.0, holder_live=True)
    gone = decide_lead(held_by("a"), "b", "s-b", 100.0, 10.0, holder_live=False)
    assert lapsed is not None and gone is not None and lapsed.term == gone.term == 4
    # the same expert in a new session is a new holder: a new term
    again = decide_lead(held_by("a"), "a", "s-new", 100.0, 10.0, holder_live=False)
    assert again is not None and again.term == 4 and again.taken


def test_assignment_refusals_name_the_reason() -> None:
    cur = held_by("a")
    ok = assign_refusal("q", cur, "a", "s-a", 3, 100.0, holder_live=True)
    assert ok is None
    cases = [
        (None, "a", "s-a", 3, True, "no_leader"),
        (cur, "a", "s-a", 2, True, "stale_term"),
        (cur, "b", "s-b", 3, True, "not_holder"),
        (cur, "a", "s-old", 3, True, "not_holder"),
        (held_by("a", deadline=99.0), "a", "s-a", 3, True, "lapsed"),
        (cur, "a", "s-a", 3, False, "lapsed"),
    ]
    for current, who, session, term, live, reason in cases:
        refused = assign_refusal("q", current, who, session, term, 100.0, holder_live=live)
        assert refused is not None and refused.reason == reason, (who, term, reason)
        assert "term" in str(refused)


def test_term_is_read_back_from_the_history_line() -> None:
    assert term_of(assigned_detail("a", 12)) == 12
    assert term_of(None) is None and term_of("by a") is None


def task(tid: str, queue: str = "c", needs: Requirements | None = None) -> TaskView:
    return TaskView(tid, "job", queue, 0, needs or Requirements(), 0.0)


def worker(name: str, free: int, *, load: int = 0, capacity: int = 4, tags: str = "") -> Worker:
    caps = Capabilities(frozenset(tags.split()) if tags else frozenset(), {})
    view = ExpertView(name, caps, capacity=capacity, load=load)
    return Worker(view, frozenset({"c"}), free)


def test_plan_fills_free_slots_by_fitness_and_load() -> None:
    tasks = [task(f"t{i}") for i in range(6)]
    busy, idle = worker("busy", 1, load=3), worker("idle", 3)
    got = plan(tasks, [busy, idle])
    # idle scores higher until its load catches up; nobody gets more than its free slots
    assert sorted(got.values()) == ["busy", "idle", "idle", "idle"]
    assert list(got)[:1] == ["t0"] and got["t0"] == "idle"
    assert len(got) == 4  # the rest wait for free slots


def test_plan_keeps_requirements_and_queues() -> None:
    gpu = task("g", needs=Requirements.of(["gpu"]))
    other = task("o", queue="elsewhere")
    got = plan([gpu, other, task("t")], [worker("cpu", 2), worker("gpu", 1, tags="gpu")])
    assert got == {"g": "gpu", "t": "cpu"}
    assert plan([gpu], [worker("cpu", 5)]) == {}


def test_free_slots() -> None:
    assert free_slots(4, 1, 2) == 1
    assert free_slots(2, 2, 3) == 0
    assert free_slots(2, 2, 1, ahead=2) == 1  # one more held ready beside a full expert
