"""The rulebook: every move of a task is decided here and handed to a store as a value.

A store never decides what an event leads to. It reads what it must (the task's fence, owner,
lease and state, its attempts), asks a function of this module, and applies the returned
:class:`Outcome` atomically, in one SQL statement, one transaction or one etcd Txn, only while
the conditions it checked still hold. A rule written once cannot drift between backends.

=====================  ==========================================  ==============  ===========
event                  function                                    next state      history
=====================  ==========================================  ==============  ===========
submitted              :func:`submitted`                           pending,        dead,
                                                                   waiting, dead,  cancelled
                                                                   cancelled       (else none)
claimed                :func:`claimed`                             running or      claimed
                                                                   claimed
started                :func:`started`                             running         started
stolen                 :func:`stolen`                              running         stolen
completed              :func:`completed`                           succeeded       succeeded
failed / timed out     :func:`failed` (the caller's retry          pending, failed retry, failed,
                       decision, made once by ``RetryPolicy``)     or dead         dead
released               :func:`released`                            pending         released
lease expired          :func:`expired`                             pending, dead   expired
session ended          :func:`expired` (``session_ended=True``)    pending, dead   expired
cancelled              :func:`cancelled`                           cancelled       cancelled
retried by hand        :func:`retried`                             pending         retried
dependency ended       :func:`dependency_ended`                    pending, dead,  ready, dead,
                                                                   cancelled       cancelled
=====================  ==========================================  ==============  ===========

What a dependency that did not succeed does to its dependant is the edge's choice
(:class:`~contend.domain.task.IfFailed`): ``fail`` kills it, ``cancel`` cancels it, ``run``
counts the edge as done. The same choice decides at submission, for a dependency that ended
before its dependant was submitted, and later, for one that ends while it waits.

A terminal outcome (:attr:`Outcome.ends`) settles the task's dependants: each waiting dependant
gets :func:`dependency_ended`, and a dependant that dies in turn settles its own.

An owner write (start, checkpoint, complete, fail, release) lands only while the writer holds
the task: :func:`refusal` is the one explanation of why it does not, used by every backend.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import Enum, StrEnum
from typing import NamedTuple

from contend.domain.task import (
    OWNED_STATES,
    TERMINAL_STATES,
    IfFailed,
    TaskState,
    can_move,
    if_failed_of,
)
from contend.errors import FencedOut, InvalidTransition

P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING
SUCCEEDED, FAILED, DEAD, CANCELLED = (
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.DEAD,
    TaskState.CANCELLED,
)


class Event(StrEnum):
    """The vocabulary of a task's history: every line of it is one of these."""

    CLAIMED = "claimed"
    STARTED = "started"
    STOLEN = "stolen"
    SUCCEEDED = "succeeded"
    RETRY = "retry"  # failed, and due again after a back-off
    FAILED = "failed"  # failed with an error that is not retried
    DEAD = "dead"  # attempts spent, or a dependency did not succeed
    RELEASED = "released"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    RETRIED = "retried"  # sent back to pending by hand
    READY = "ready"  # its last dependency succeeded


class Attempts(Enum):
    """What an outcome does to the task's attempt count."""

    KEEP = "keep"
    COUNT = "count"  # a claim: one attempt more
    GIVE_BACK = "give_back"  # a release: the attempt is not counted
    RESET = "reset"  # a retry by hand: fresh attempts

    def apply(self, attempts: int) -> int:
        if self is _KEEP:
            return attempts
        if self is _COUNT:
            return attempts + 1
        if self is _GIVE_BACK:
            return max(0, attempts - 1)
        return 0


_KEEP, _COUNT, _GIVE_BACK = Attempts.KEEP, Attempts.COUNT, Attempts.GIVE_BACK
_new = tuple.__new__


class Outcome(NamedTuple):
    """What one event does to one task, decided here and applied by a store as it is.

    * ``state`` — the next state; ``event``, ``actor`` and ``detail`` — the history line.
    * ``owned`` — the task keeps (or gets) an owner and a lease; otherwise both are cleared.
    * ``due_in`` — the task is due this many seconds after the store's *now* (``None``: keep
      its due time); ``due_now`` — not due before now (``run_at = max(run_at, now)``);
      ``due_by_now`` — due now at the latest (``run_at = min(run_at, now)``).
    * ``error_json`` / ``result_json`` — set when not ``None``, kept otherwise.
    * ``attempts`` — what happens to the attempt count.

    A named tuple rather than a frozen dataclass: as immutable, and built in a third of the time
    (one is made per task on the hot path of every backend).
    """

    state: TaskState
    event: Event
    actor: str | None = None
    detail: str | None = None
    owned: bool = False
    due_in: float | None = None
    due_now: bool = False
    due_by_now: bool = False
    error_json: str | None = None
    result_json: str | None = None
    attempts: Attempts = Attempts.KEEP

    @property
    def ends(self) -> bool:
        """The task reached a terminal state: its dependants must be settled."""
        return self.state in TERMINAL_STATES

    def run_at(self, current: float, now: float) -> float:
        """The task's due time after this outcome, given its *current* one."""
        if self.due_in is not None:
            return now + self.due_in
        if self.due_now:
            return max(current, now)
        if self.due_by_now:
            return min(current, now)
        return current


def error_json(kind: str, message: str) -> str:
    """The JSON of an error the store itself records (a lapsed lease, a failed dependency)."""
    return json.dumps({"type": kind, "message": message})


# -- submission ------------------------------------------------------------------------------


class Birth(NamedTuple):
    """How a submitted task starts: its state, its error, the dependencies it waits on, and the
    history line of a task that ends at birth (``event`` None: it has none)."""

    state: TaskState
    waits_on: tuple[str, ...]
    error_json: str | None = None
    event: Event | None = None
    detail: str | None = None


def submitted(
    depends_on: Sequence[str],
    dep_states: Mapping[str, TaskState],
    if_failed: Sequence[str] = (),
) -> Birth:
    """A new task's first state. *dep_states* has the state of every dependency already in the
    store; one absent from it is submitted in the same batch, so not finished. *if_failed*:
    the choice of each edge, aligned with *depends_on* (``()``: all ``fail``); the first
    dependency, in order, that did not succeed on an edge other than ``run`` decides."""
    deps = tuple(depends_on)
    waits_on = tuple(d for d in deps if not _finished(dep_states.get(d)))
    for d in deps:
        state = dep_states.get(d)
        if not _did_not_succeed(state):
            continue
        choice = if_failed_of(deps, if_failed, d)
        if choice == IfFailed.RUN:
            continue
        if choice == IfFailed.CANCEL:
            why = f"dependency {d} ended {state} (if_failed=cancel)"
            return Birth(CANCELLED, waits_on, None, Event.CANCELLED, why)
        error = _dependency_error(f"dependency {d} did not succeed")
        return Birth(DEAD, waits_on, error, Event.DEAD, f"dependency {d} ended {state}")
    return Birth(W if waits_on else P, waits_on)


def _finished(state: TaskState | None) -> bool:
    return state is not None and state.terminal


def _did_not_succeed(state: TaskState | None) -> bool:
    return state is not None and state.terminal and state != SUCCEEDED


def _dependency_error(message: str) -> str:
    return error_json("DependencyFailed", message)


# -- the claim protocol ----------------------------------------------------------------------


def claimed(expert: str, *, start: bool = True) -> Outcome:
    """A claim: one attempt more, fence + 1 and a lease (the store sets those two)."""
    return Outcome(R if start else C, Event.CLAIMED, expert, owned=True, attempts=Attempts.COUNT)


def stolen(thief: str, victim: str) -> Outcome:
    """A claimed-but-unstarted task taken over (fence + 1, new lease), its attempt kept."""
    return Outcome(R, Event.STOLEN, thief, f"from {victim}", owned=True)


def started(expert: str) -> Outcome:
    return Outcome(R, Event.STARTED, expert, owned=True)


#: The history detail of a completion written in the task's own transaction.
IN_TRANSACTION = "in the task's transaction"
#: The error a success leaves: JSON null, so that an earlier attempt's error is not shown on a
#: task that succeeded.
NO_ERROR = "null"


def completed(expert: str, result_json: str, *, in_transaction: bool = False) -> Outcome:
    """Succeeded with *result_json*; the error of an earlier attempt is cleared.
    *in_transaction*: written in the task's own transaction (with the task's effects, all or
    none), which the history line says."""
    detail = IN_TRANSACTION if in_transaction else None
    # every field given, straight to tuple.__new__: one of these is made per task
    return _new(
        Outcome,
        (
            SUCCEEDED,
            Event.SUCCEEDED,
            expert,
            detail,
            False,
            None,
            False,
            False,
            NO_ERROR,
            result_json,
            _KEEP,
        ),
    )


def failed(
    expert: str,
    error: str,
    retry_delay: float | None,
    final_state: TaskState = DEAD,
) -> Outcome:
    """A failed (or timed-out) attempt, as its owner decided with its retry policy: due again
    after *retry_delay* seconds, or *final_state* (``failed`` or ``dead``) when it is None.

    The decision is the caller's (``RetryPolicy.decide`` weighs the attempt against
    ``max_attempts`` once, in the expert); the store applies it and decides nothing again.
    """
    if retry_delay is not None:
        return Outcome(
            P, Event.RETRY, expert, f"in {retry_delay:.3f}s", due_in=retry_delay, error_json=error
        )
    if final_state not in (FAILED, DEAD):
        raise ValueError(f"a failure ends failed or dead, not {final_state}")
    return Outcome(final_state, Event(str(final_state)), expert, error_json=error)


def released(expert: str) -> Outcome:
    """Given back unrun: pending at once, the attempt not counted."""
    return Outcome(P, Event.RELEASED, expert, attempts=Attempts.GIVE_BACK)


#: The history detail of a task whose owner's session was ended (``Store.end_session``).
SESSION_ENDED = "its session was ended"


def expired(
    owner: str | None, attempts: int, max_attempts: int, *, session_ended: bool = False
) -> Outcome:
    """The owner's lease lapsed: the task is pending again while attempts remain (a crash
    uses an attempt as an exception does), dead after the last one. Its checkpoint stays.

    *session_ended*: the lease did not run out but was ended on purpose (a supervisor saw the
    owner's process die, ``Store.end_session``): the same rule, said in the history."""
    detail = SESSION_ENDED if session_ended else None
    if attempts < max_attempts:
        # Due at once (it was due when claimed), and by the clock of whoever gives it back:
        # on etcd the due time is a client's wall clock, and a submitter's clock that runs
        # ahead of the experts' must not keep a dead owner's task from them.
        return Outcome(P, Event.EXPIRED, owner, detail, due_by_now=True)
    why = "its session was ended" if session_ended else "lost its lease"
    error = error_json("LeaseExpired", f"expert {owner} {why} on the last attempt")
    return Outcome(DEAD, Event.EXPIRED, owner, detail, error_json=error)


# -- dependants ------------------------------------------------------------------------------


def dependency_ended(
    dependency: str, state: TaskState, deps_left: int, if_failed: str = IfFailed.FAIL
) -> Outcome | None:
    """A waiting task's dependency *dependency* ended in *state*; *deps_left* counts its
    unfinished dependencies, that one included; *if_failed* is the choice of their edge.
    ``None``: it goes on waiting (one fewer)."""
    if state == SUCCEEDED or if_failed == IfFailed.RUN:
        if deps_left > 1:
            return None
        why = (
            f"dependency {dependency} succeeded"
            if state == SUCCEEDED
            else f"dependency {dependency} ended {state} (if_failed=run)"
        )
        return Outcome(P, Event.READY, None, why, due_now=True)
    why = f"dependency {dependency} ended {state}"
    if if_failed == IfFailed.CANCEL:
        return Outcome(CANCELLED, Event.CANCELLED, None, f"{why} (if_failed=cancel)")
    return Outcome(DEAD, Event.DEAD, None, why, error_json=_dependency_error(why))


# -- management ------------------------------------------------------------------------------

#: The states a task may be retried from by hand.
RETRYABLE_STATES = frozenset({FAILED, DEAD, CANCELLED})


def cancelled(task_id: str, state: TaskState, owner: str | None) -> Outcome:
    """Cancel by hand: pending, waiting or owned tasks; the owner is fenced out."""
    if not can_move(state, CANCELLED):
        raise InvalidTransition(task_id, state, "cancel")
    return Outcome(CANCELLED, Event.CANCELLED, owner)


def retried(task_id: str, state: TaskState) -> Outcome:
    """Retry by hand: a failed, dead or cancelled task is due now, with fresh attempts."""
    if state not in RETRYABLE_STATES:
        raise InvalidTransition(task_id, state, "retry")
    return Outcome(P, Event.RETRIED, None, due_in=0.0, attempts=Attempts.RESET)


# -- fenced writes ---------------------------------------------------------------------------

#: The states each owner write accepts.
START_STATES = frozenset({C})
WRITE_STATES = OWNED_STATES


class Refusal(StrEnum):
    """Why an owner write was fenced out (``FencedOut.reason``)."""

    GONE = "gone"
    STALE_FENCE = "stale_fence"
    NOT_OWNER = "not_owner"
    NOT_OWNED = "not_owned"  # the task is in a state the write does not accept
    TASK_LEASE = "task_lease"
    EXPERT_LEASE = "expert_lease"
    RACED = "raced"  # the task changed between the check and the write: try again


class Holding(NamedTuple):
    """What a store knows of a task when an owner writes to it."""

    fence: int
    owner: str | None
    state: TaskState | str
    lease_deadline: float | None


def refusal(
    task_id: str,
    fence: int,
    expert: str,
    holding: Holding | None,
    now: float,
    *,
    expert_live: bool,
    states: frozenset[TaskState] = WRITE_STATES,
) -> FencedOut | None:
    """``None`` when *expert*'s write at *fence* may land on the task as *holding* says it is
    (``None``: no such task), else the :class:`FencedOut` that says why not."""
    if holding is None:
        return _refused(task_id, fence, Refusal.GONE, "no such task")
    if holding.fence != fence:
        return _refused(
            task_id, fence, Refusal.STALE_FENCE, f"the task is at fence {holding.fence}"
        )
    if holding.owner != expert:
        detail = f"{expert} does not own it (owner: {holding.owner})"
        return _refused(task_id, fence, Refusal.NOT_OWNER, detail)
    if holding.state not in states:
        return _refused(task_id, fence, Refusal.NOT_OWNED, f"the task is {holding.state}")
    if holding.lease_deadline is None or holding.lease_deadline < now:
        return _refused(task_id, fence, Refusal.TASK_LEASE, "the lease lapsed")
    if not expert_live:
        detail = f"the lease of expert {expert} lapsed"
        return _refused(task_id, fence, Refusal.EXPERT_LEASE, detail)
    return None


def raced(task_id: str, fence: int) -> FencedOut:
    """The refusal of a write whose task changed while the store applied it."""
    return _refused(task_id, fence, Refusal.RACED, "the task changed during the write")


def _refused(task_id: str, fence: int, reason: Refusal, detail: str) -> FencedOut:
    return FencedOut(task_id, fence, detail, reason=str(reason))
