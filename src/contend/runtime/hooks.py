"""Hooks: where cross-cutting concerns (counters, logs, metrics, tracing) plug into an expert.

In the manner of Dramatiq's middleware: subclass :class:`Hook`, override the moments you care
about, and pass instances to ``Expert(app, hooks=[...])``. Every method receives plain values
(the expert's name, the :class:`~contend.store.port.Claimed` task, the outcome sent) and returns
nothing; the expert never waits on a hook and never lets one change what it does. A hook that
raises is logged and skipped: it never breaks the claim loop, a run or a commit.

Hooks run on the expert's event loop, in the order given, after the expert's own two:
:class:`ExpertStats` (the counters behind ``expert.stats`` and the heartbeat) and
:class:`TaskLog` (the log lines of task outcomes). Keep them quick; hand slow work (an HTTP
exporter) to a task or thread of your own.

A run's moments: ``before_execute`` when it starts, then exactly one of ``after_execute`` (it
produced an outcome: a result, or a failure with what the retry policy decided) or
``on_abandoned`` (it was stopped: the lease was lost, the task is no longer this expert's, or
the expert stopped before it finished); an outcome is then either ``on_committed`` or
``on_fenced_out``, or dropped with the lease (``on_lease_lost``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from contend.errors import FencedOut
from contend.store.port import Claimed, Completion, Failure, Heartbeat

log = logging.getLogger("contend.expert")
hook_log = logging.getLogger("contend.hooks")

Outcome = Completion | Failure


class Hook:
    """No-op base: override what you need."""

    #: The expert's own hooks, trusted not to raise, are called without a guard.
    _trusted: ClassVar[bool] = False

    def on_claimed(self, expert: str, tasks: Sequence[Claimed], attempted: int) -> None:
        """A claim call won *tasks* out of *attempted* candidates (the rest a rival won; a
        claim of whatever is best attempts what it got). Not called when nothing was tried."""

    def on_stolen(self, expert: str, victim: str, tasks: Sequence[Claimed]) -> None:
        """This expert took *tasks*, claimed but unstarted, from *victim* (work stealing)."""

    def on_taken_over(self, expert: str, task_ids: Sequence[str]) -> None:
        """Tasks this expert had prefetched were taken by another before it started them."""

    def before_execute(self, expert: str, task: Claimed) -> None:
        """A run of *task* starts."""

    def after_execute(
        self,
        expert: str,
        task: Claimed,
        outcome: Outcome,
        seconds: float,
        error: BaseException | None,
    ) -> None:
        """A run ended with *outcome* after *seconds*: a Completion, or a Failure carrying the
        retry decision (``retry_delay`` or ``final_state``). *error* is what the task raised
        (a TimeoutError for a timeout), None on success or for an unknown task type."""

    def on_abandoned(self, expert: str, task: Claimed, reason: str) -> None:
        """A run was stopped without an outcome; nothing of it will be committed."""

    def on_committed(self, expert: str, outcome: Outcome) -> None:
        """The store accepted *outcome* under its fence."""

    def on_fenced_out(self, expert: str, outcome: Outcome, refusal: FencedOut) -> None:
        """The store refused *outcome*: another owner, a newer fence or a lapsed lease."""

    def on_heartbeat(self, expert: str, beat: Heartbeat, held: int) -> None:
        """A renewal succeeded: *beat* was published; the store says this expert holds *held*
        tasks."""

    def on_lease_lost(self, expert: str, reason: str, running: int, dropped: int) -> None:
        """The lease was lost: *running* runs were stopped and *dropped* finished outcomes
        will never be committed."""

    def on_renewal(self, expert: str, seconds: float, margin: float) -> None:
        """A renewal answered after *seconds*; *margin* is how much of the lease it renewed
        was still left then, by this expert's clock (the lease safety margin: at 0 the
        watchdog would have declared the lease lost)."""

    def on_expired(self, expert: str, count: int) -> None:
        """This expert's housekeeping returned *count* tasks whose lease had lapsed (anyone's)
        to pending, or dead on their last attempt."""


#: The moments a hook can override, by name.
MOMENTS = tuple(name for name in vars(Hook) if name.startswith(("on_", "before_", "after_")))


class Hooks(Hook):
    """The hooks of one expert, called in order; one that raises is logged and skipped.

    Calls go only to hooks that override the moment, so an unused moment costs one loop over
    an empty tuple."""

    def __init__(self, hooks: Iterable[Hook]) -> None:
        self.hooks = tuple(hooks)
        self._by_moment: dict[str, tuple[Hook, ...]] = {
            name: tuple(h for h in self.hooks if getattr(type(h), name) is not getattr(Hook, name))
            for name in MOMENTS
        }
        self._reported: set[tuple[int, str]] = set()
        # The moments of the hot path (several calls per task) skip the dispatch loop: none
        # overridden, a no-op; one, that hook's method behind the same guard; more, their
        # methods bound once.
        for name in ("before_execute", "after_execute", "on_committed"):
            only = self._by_moment[name]
            if not only:
                setattr(self, name, _nothing)
            elif len(only) == 1:
                hook = only[0]
                # the expert's own hooks do not raise: no guard around them
                bound = getattr(hook, name) if hook._trusted else self._guarded(hook, name)
                setattr(self, name, bound)
            else:
                setattr(self, name, self._bound_all(only, name))

    def _guarded(self, hook: Hook, moment: str) -> Callable[..., None]:
        method = getattr(hook, moment)

        def call(*args: Any) -> None:
            try:
                method(*args)
            except Exception as exc:
                self._failed(hook, moment, exc)

        return call

    def _bound_all(self, hooks: tuple[Hook, ...], moment: str) -> Callable[..., None]:
        pairs = tuple((hook, getattr(hook, moment)) for hook in hooks)

        def call(*args: Any) -> None:
            for hook, method in pairs:
                try:
                    method(*args)
                except Exception as exc:
                    self._failed(hook, moment, exc)

        return call

    def _failed(self, hook: Hook, moment: str, exc: Exception) -> None:
        first = (id(hook), moment) not in self._reported
        self._reported.add((id(hook), moment))
        hook_log.error(
            "hook %s.%s raised %r; ignored",
            type(hook).__name__,
            moment,
            exc,
            exc_info=first,  # the traceback once per hook and moment
        )

    def _call(self, moment: str, *args: Any) -> None:
        for hook in self._by_moment[moment]:
            try:
                getattr(hook, moment)(*args)
            except Exception as exc:
                self._failed(hook, moment, exc)

    def on_claimed(self, expert: str, tasks: Sequence[Claimed], attempted: int) -> None:
        self._call("on_claimed", expert, tasks, attempted)

    def on_stolen(self, expert: str, victim: str, tasks: Sequence[Claimed]) -> None:
        self._call("on_stolen", expert, victim, tasks)

    def on_taken_over(self, expert: str, task_ids: Sequence[str]) -> None:
        self._call("on_taken_over", expert, task_ids)

    def before_execute(self, expert: str, task: Claimed) -> None:
        self._call("before_execute", expert, task)

    def after_execute(
        self,
        expert: str,
        task: Claimed,
        outcome: Outcome,
        seconds: float,
        error: BaseException | None,
    ) -> None:
        self._call("after_execute", expert, task, outcome, seconds, error)

    def on_abandoned(self, expert: str, task: Claimed, reason: str) -> None:
        self._call("on_abandoned", expert, task, reason)

    def on_committed(self, expert: str, outcome: Outcome) -> None:
        self._call("on_committed", expert, outcome)

    def on_fenced_out(self, expert: str, outcome: Outcome, refusal: FencedOut) -> None:
        self._call("on_fenced_out", expert, outcome, refusal)

    def on_heartbeat(self, expert: str, beat: Heartbeat, held: int) -> None:
        self._call("on_heartbeat", expert, beat, held)

    def on_lease_lost(self, expert: str, reason: str, running: int, dropped: int) -> None:
        self._call("on_lease_lost", expert, reason, running, dropped)

    def on_renewal(self, expert: str, seconds: float, margin: float) -> None:
        self._call("on_renewal", expert, seconds, margin)

    def on_expired(self, expert: str, count: int) -> None:
        self._call("on_expired", expert, count)


def task_fields(expert: str, task: Claimed) -> dict[str, Any]:
    """The ``extra`` of a log line about *task*: ``--log-json`` writes these fields on every
    line about a task (task id, type, expert, fence, attempt)."""
    return {
        "task_id": task.id,
        "task_type": task.type,
        "expert": expert,
        "fence": task.fence,
        "attempt": task.attempt,
    }


@dataclass
class ExpertStats(Hook):
    """An expert's counters (``expert.stats``); the heartbeat publishes them."""

    _trusted: ClassVar[bool] = True

    claim_attempts: int = 0
    claims_won: int = 0
    tasks_done: int = 0
    tasks_failed: int = 0
    fenced_out: int = 0
    leases_lost: int = 0
    heartbeats: int = 0
    stolen: int = 0  # tasks this expert took from others
    stolen_from_me: int = 0  # prefetched tasks others took before this expert started them

    def on_claimed(self, expert: str, tasks: Sequence[Claimed], attempted: int) -> None:
        self.claim_attempts += attempted
        self.claims_won += len(tasks)

    def on_stolen(self, expert: str, victim: str, tasks: Sequence[Claimed]) -> None:
        self.stolen += len(tasks)

    def on_taken_over(self, expert: str, task_ids: Sequence[str]) -> None:
        self.stolen_from_me += len(task_ids)

    def on_committed(self, expert: str, outcome: Outcome) -> None:
        if isinstance(outcome, Completion):
            self.tasks_done += 1
        else:
            self.tasks_failed += 1

    def on_fenced_out(self, expert: str, outcome: Outcome, refusal: FencedOut) -> None:
        self.fenced_out += 1

    def on_heartbeat(self, expert: str, beat: Heartbeat, held: int) -> None:
        self.heartbeats += 1

    def on_lease_lost(self, expert: str, reason: str, running: int, dropped: int) -> None:
        self.leases_lost += 1


class TaskLog(Hook):
    """The log lines of task outcomes, on the ``contend.expert`` logger."""

    _trusted: ClassVar[bool] = True

    def after_execute(
        self,
        expert: str,
        task: Claimed,
        outcome: Outcome,
        seconds: float,
        error: BaseException | None,
    ) -> None:
        if not isinstance(outcome, Failure):
            return
        body = json.loads(outcome.error_json)
        kind, message = body.get("type"), str(body.get("message", ""))[:200]
        extra = task_fields(expert, task)
        if outcome.retry_delay is not None:
            log.info(
                "task %s (%s) attempt %d fence %d on %s failed: %s: %s; retry in %.2fs",
                task.id,
                task.type,
                task.attempt,
                task.fence,
                expert,
                kind,
                message,
                outcome.retry_delay,
                extra=extra,
            )
        else:
            log.warning(
                "task %s (%s) attempt %d fence %d on %s failed: %s: %s; now %s",
                task.id,
                task.type,
                task.attempt,
                task.fence,
                expert,
                kind,
                message,
                outcome.final_state,
                extra=extra,
            )

    def on_stolen(self, expert: str, victim: str, tasks: Sequence[Claimed]) -> None:
        log.info("expert %s stole %d task(s) from %s", expert, len(tasks), victim)

    def on_fenced_out(self, expert: str, outcome: Outcome, refusal: FencedOut) -> None:
        log.warning(
            "expert %s: commit refused: %s",
            expert,
            refusal,
            extra={"task_id": outcome.task_id, "expert": expert, "fence": outcome.fence},
        )

    def on_lease_lost(self, expert: str, reason: str, running: int, dropped: int) -> None:
        log.error(
            "expert %s lost its lease (%s): stopping %d running task(s) and dropping %d "
            "finished result(s); committing none",
            expert,
            reason,
            running,
            dropped,
        )


def _nothing(*args: Any) -> None:
    return None
