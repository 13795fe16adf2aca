"""The rulebook on its own: every transition's outcome, as a value."""

from __future__ import annotations

import json

import pytest

from contend.domain import transitions as rules
from contend.domain.task import TaskState
from contend.domain.transitions import Attempts, Event, Holding, Refusal
from contend.errors import InvalidTransition

P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING
OK, FAILED, DEAD, CANCELLED = (
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.DEAD,
    TaskState.CANCELLED,
)


def test_a_claim_counts_an_attempt_and_a_steal_does_not() -> None:
    claim = rules.claimed("e1")
    assert (claim.state, claim.event, claim.actor, claim.owned) == (R, Event.CLAIMED, "e1", True)
    assert rules.claimed("e1", start=False).state == C
    assert claim.attempts.apply(2) == 3
    steal = rules.stolen("thief", "victim")
    assert (steal.state, steal.detail, steal.attempts) == (R, "from victim", Attempts.KEEP)


def test_a_failure_applies_the_owner_decision() -> None:
    retry = rules.failed("e1", '{"type":"Boom"}', 1.5)
    assert (retry.state, retry.event, retry.detail) == (P, Event.RETRY, "in 1.500s")
    assert retry.run_at(current=10.0, now=100.0) == 101.5
    assert not retry.ends and not retry.owned
    for final in (FAILED, DEAD):
        end = rules.failed("e1", "{}", None, final)
        assert (end.state, end.event, end.error_json) == (final, Event(str(final)), "{}")
        assert end.ends
    with pytest.raises(ValueError, match="failed or dead"):
        rules.failed("e1", "{}", None, OK)


def test_an_expiry_uses_an_attempt_and_the_last_one_is_dead() -> None:
    again = rules.expired("e1", attempts=1, max_attempts=2)
    assert (again.state, again.event, again.actor, again.error_json) == (
        P,
        Event.EXPIRED,
        "e1",
        None,
    )
    dead = rules.expired("e1", attempts=2, max_attempts=2)
    assert dead.state == DEAD and dead.ends
    assert json.loads(dead.error_json or "")["type"] == "LeaseExpired"


def test_a_task_given_back_is_due_by_the_clock_of_whoever_gives_it_back() -> None:
    # etcd's due times are clients' wall clocks: a submitter's clock an hour ahead must not
    # keep a dead owner's task from experts whose clock is right (issue 12, the clock chaos)
    again = rules.expired("e1", attempts=1, max_attempts=2)
    assert again.run_at(current=5_000.0, now=1_400.0) == 1_400.0
    assert again.run_at(current=1_000.0, now=1_400.0) == 1_000.0  # due earlier: stays so
    ready = rules.dependency_ended("d", TaskState.SUCCEEDED, deps_left=1)
    assert ready is not None and ready.run_at(current=1_000.0, now=1_400.0) == 1_400.0


def test_an_ended_session_is_an_expiry_that_says_so() -> None:
    lapsed = rules.expired("e1", attempts=1, max_attempts=2)
    ended = rules.expired("e1", attempts=1, max_attempts=2, session_ended=True)
    assert ended._replace(detail=None) == lapsed  # the same rule, only the history differs
    assert ended.detail == rules.SESSION_ENDED
    dead = rules.expired("e1", attempts=2, max_attempts=2, session_ended=True)
    assert (
        dead.state == DEAD and "session was ended" in json.loads(dead.error_json or "")["message"]
    )


def test_a_release_gives_the_attempt_back_but_never_below_zero() -> None:
    out = rules.released("e1")
    assert (out.state, out.event) == (P, Event.RELEASED)
    assert out.attempts.apply(1) == 0 and out.attempts.apply(0) == 0


def test_dependants_wait_for_the_last_success_and_die_of_any_failure() -> None:
    assert rules.dependency_ended("a", OK, deps_left=2) is None
    ready = rules.dependency_ended("a", OK, deps_left=1)
    assert ready is not None and (ready.state, ready.event, ready.due_now) == (P, Event.READY, True)
    assert ready.run_at(current=5.0, now=3.0) == 5.0  # a delayed task keeps its delay
    assert ready.run_at(current=1.0, now=3.0) == 3.0
    for state in (FAILED, DEAD, CANCELLED):
        dead = rules.dependency_ended("a", state, deps_left=3)
        assert dead is not None and (dead.state, dead.event) == (DEAD, Event.DEAD)
        assert dead.detail == f"dependency a ended {state}"
        assert json.loads(dead.error_json or "")["type"] == "DependencyFailed"


def test_a_new_task_waits_on_unfinished_dependencies_and_is_dead_after_a_failed_one() -> None:
    assert rules.submitted([], {}) == rules.Birth(P, ())
    assert rules.submitted(["a", "b"], {"a": OK}) == rules.Birth(W, ("b",))
    born = rules.submitted(["a", "b"], {"a": CANCELLED})
    assert (born.state, born.waits_on) == (DEAD, ("b",))
    assert "dependency a did not succeed" in (born.error_json or "")
    assert (born.event, born.detail) == (Event.DEAD, "dependency a ended cancelled")


@pytest.mark.parametrize("state", [FAILED, DEAD, CANCELLED])
def test_each_edge_chooses_what_a_dependency_that_did_not_succeed_does(state: TaskState) -> None:
    cancel = rules.dependency_ended("a", state, 2, "cancel")
    assert cancel is not None and (cancel.state, cancel.event) == (CANCELLED, Event.CANCELLED)
    assert cancel.detail == f"dependency a ended {state} (if_failed=cancel)"
    assert cancel.error_json is None
    assert rules.dependency_ended("a", state, 2, "run") is None  # one fewer to wait for
    ready = rules.dependency_ended("a", state, 1, "run")
    assert ready is not None and (ready.state, ready.event) == (P, Event.READY)
    assert ready.detail == f"dependency a ended {state} (if_failed=run)"
    dead = rules.dependency_ended("a", state, 1, "fail")
    assert dead is not None and dead.state == DEAD
    # the same choices at submission, for a dependency that had ended already
    assert rules.submitted(["a", "b"], {"a": state}, ("run", "fail")) == rules.Birth(W, ("b",))
    assert rules.submitted(["a"], {"a": state}, ("run",)) == rules.Birth(P, ())
    born = rules.submitted(["a", "b"], {"a": state}, ("cancel", "fail"))
    assert (born.state, born.event, born.error_json) == (CANCELLED, Event.CANCELLED, None)
    assert born.detail == f"dependency a ended {state} (if_failed=cancel)"
    # the first edge, in order, whose dependency did not succeed and that does not run decides
    both = {"a": state, "b": state}
    assert rules.submitted(["a", "b"], both, ("run", "cancel")).state == CANCELLED
    assert rules.submitted(["a", "b"], both, ("fail", "cancel")).state == DEAD
    assert rules.submitted(["a", "b"], both, ("run", "run")) == rules.Birth(P, ())


@pytest.mark.parametrize("state", [P, W, C, R])
def test_cancel_applies_to_unfinished_tasks(state: TaskState) -> None:
    out = rules.cancelled("t", state, "e1")
    assert (out.state, out.event, out.actor, out.owned) == (CANCELLED, Event.CANCELLED, "e1", False)


@pytest.mark.parametrize("state", [OK, FAILED, DEAD, CANCELLED])
def test_cancel_of_a_finished_task_is_refused(state: TaskState) -> None:
    with pytest.raises(InvalidTransition, match=f"cannot cancel task t: it is {state}"):
        rules.cancelled("t", state, None)


def test_retry_by_hand_resets_attempts_and_is_only_for_tasks_that_did_not_succeed() -> None:
    for state in (FAILED, DEAD, CANCELLED):
        out = rules.retried("t", state)
        assert (out.state, out.event, out.attempts.apply(3)) == (P, Event.RETRIED, 0)
        assert out.run_at(current=50.0, now=10.0) == 10.0
    for state in (P, W, C, R, OK):
        with pytest.raises(InvalidTransition):
            rules.retried("t", state)


def test_refusals_name_the_first_reason() -> None:
    live = Holding(3, "e1", R, 100.0)

    def why(holding: Holding | None, **kw: object) -> str | None:
        args: dict[str, object] = {"expert_live": True, **kw}
        out = rules.refusal("t", 3, "e1", holding, 50.0, **args)  # type: ignore[arg-type]
        return None if out is None else out.reason

    assert why(live) is None
    assert why(None) == Refusal.GONE
    assert why(live._replace(fence=4)) == Refusal.STALE_FENCE
    assert why(live._replace(owner="e2")) == Refusal.NOT_OWNER
    assert why(live, states=rules.START_STATES) == Refusal.NOT_OWNED
    assert why(live._replace(lease_deadline=49.0)) == Refusal.TASK_LEASE
    assert why(live._replace(lease_deadline=None)) == Refusal.TASK_LEASE
    assert why(live, expert_live=False) == Refusal.EXPERT_LEASE
    assert why(live._replace(fence=4, owner="e2")) == Refusal.STALE_FENCE
    assert rules.raced("t", 3).reason == Refusal.RACED


def test_completed_built_fast_equals_the_named_tuple() -> None:
    # completed() builds its Outcome straight through tuple.__new__ (one per task): it must
    # stay the same value as the keyword-built one when Outcome gains a field.
    fast = rules.completed("e1", '{"ok":1}')
    want = rules.Outcome(
        TaskState.SUCCEEDED,
        Event.SUCCEEDED,
        "e1",
        error_json=rules.NO_ERROR,  # an earlier attempt's error is cleared
        result_json='{"ok":1}',
    )
    assert fast == want
    assert len(fast) == len(rules.Outcome._fields)
