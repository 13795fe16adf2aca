"""Why a task is not running yet, as the store sees it: one rule, used by ``contend tasks
show``, the dashboard and the ``contend_pending_blocked`` metric.

The rule looks only at what every store can report: the task (its state, queue, type,
requirements and due time) and the live experts (their queues, task types, capabilities, tier
and load). The checks go from the task outwards, and the first that holds is the answer:

1. ``waiting_on_dependencies`` — the task is ``waiting``: a task it depends on has not ended;
2. ``due_later`` — pending, but its due time (a delay, or a retry's back-off) is still ahead;
3. ``no_live_expert`` — no live expert claims from its queue;
4. ``no_expert_with_type`` — experts serve the queue, but none has the task's type;
5. ``no_expert_with_requirements`` — experts have the type, but none has the capability tags
   and resource amounts the task requires;
6. ``held_by_concurrency_limit`` — its limit key already has as many tasks claimed or
   running as the task's concurrency limit allows;
7. ``held_by_rate_limit`` — its limit key's rate allows no start this moment;
8. ``emergency_standby`` — the only experts that could run it are emergency experts, which
   join in only while the cluster is under pressure;
9. ``all_capable_experts_busy`` — the experts that could run it have no free slot;
10. ``claimable`` — an expert that could run it has a free slot: it should be claimed at once
    (it may be in a race window or an auction this moment, or wait for its turn among the
    keys of a fair queue). A task that stays here for long points at something the store
    cannot see (a stalled expert, a store that does not wake experts).

The limits are read from the store's state of the task's key (``Store.key_states``), the
same numbers a claim compares. contend has no queue pause, so no reason names one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from contend.domain.limits import KeyState
from contend.domain.task import Capabilities, Requirements, TaskState


class Blocker(StrEnum):
    """Why a pending or waiting task is not running yet (see the module's docstring)."""

    WAITING_ON_DEPENDENCIES = "waiting_on_dependencies"
    DUE_LATER = "due_later"
    NO_LIVE_EXPERT = "no_live_expert"
    NO_EXPERT_WITH_TYPE = "no_expert_with_type"
    NO_EXPERT_WITH_REQUIREMENTS = "no_expert_with_requirements"
    HELD_BY_CONCURRENCY_LIMIT = "held_by_concurrency_limit"
    HELD_BY_RATE_LIMIT = "held_by_rate_limit"
    EMERGENCY_STANDBY = "emergency_standby"
    ALL_CAPABLE_EXPERTS_BUSY = "all_capable_experts_busy"
    CLAIMABLE = "claimable"


@dataclass(frozen=True, slots=True)
class ExpertFacts:
    """What the rule needs of one expert, as its heartbeats published it."""

    name: str
    alive: bool
    queues: frozenset[str]
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: The task types its app has; empty when the expert did not say (it may run any).
    task_types: frozenset[str] = frozenset()
    load: int = 0
    capacity: int = 1
    tier: str = "general"
    active: bool = False  # for an emergency expert: joined in (the cluster is under pressure)

    def has_type(self, task_type: str) -> bool:
        return not self.task_types or task_type in self.task_types

    @property
    def standing_by(self) -> bool:
        return self.tier == "emergency" and not self.active

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.load)


@dataclass(frozen=True, slots=True)
class PendingFacts:
    """What the rule needs of the task."""

    id: str
    type: str
    queue: str
    state: TaskState
    run_at: float
    requirements: Requirements = field(default_factory=Requirements)
    attempts: int = 0
    depends_on: tuple[str, ...] = ()
    limit_key: str | None = None
    concurrency_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The reason, a sentence for people, and the experts it concerns (those that could run
    the task, for ``all_capable_experts_busy`` and ``claimable``)."""

    blocker: Blocker
    message: str
    experts: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"reason": str(self.blocker), "message": self.message, "experts": list(self.experts)}


def _names(experts: Iterable[ExpertFacts], most: int = 5) -> str:
    names = [e.name for e in experts]
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _wanted(req: Requirements) -> str:
    parts = sorted(req.tags) + [f"{k}={v:g}" for k, v in sorted(req.resources.items())]
    return ", ".join(parts) or "nothing"


def _held_by_limit(task: PendingFacts, now: float, key: KeyState | None) -> Diagnosis | None:
    if task.limit_key is None or key is None:
        return None
    most = task.concurrency_limit
    if most is not None and key.held >= most:
        return Diagnosis(
            Blocker.HELD_BY_CONCURRENCY_LIMIT,
            f"its limit key {task.limit_key!r} has {key.held} task(s) claimed or running, "
            f"at most {most} at once",
        )
    if key.rate is not None and key.rate_room(now) == 0:
        again = key.rate.next_start(key.tat)
        wait = f"; room again in {again - now:.2f}s" if again is not None else ""
        return Diagnosis(
            Blocker.HELD_BY_RATE_LIMIT,
            f"its limit key {task.limit_key!r} is at its rate ({key.rate.text()}){wait}",
        )
    return None


def why_not_running(
    task: PendingFacts,
    now: float,
    experts: Sequence[ExpertFacts],
    keys: Mapping[str, KeyState] | None = None,
) -> Diagnosis | None:
    """Why *task* is not running at store time *now*; None when it is not pending or waiting
    (it is owned, or it has ended). *keys*: the state of the limit keys (those missing, or
    None, are not diagnosed)."""
    if task.state == TaskState.WAITING:
        n = len(task.depends_on)
        return Diagnosis(
            Blocker.WAITING_ON_DEPENDENCIES,
            f"waiting for {n} dependenc{'y' if n == 1 else 'ies'} to end",
        )
    if task.state != TaskState.PENDING:
        return None
    if task.run_at > now:
        why = "its retry back-off" if task.attempts else "its delay"
        return Diagnosis(Blocker.DUE_LATER, f"due in {task.run_at - now:.1f}s ({why})")
    live = [e for e in experts if e.alive and task.queue in e.queues]
    if not live:
        return Diagnosis(Blocker.NO_LIVE_EXPERT, f"no live expert claims from queue {task.queue!r}")
    typed = [e for e in live if e.has_type(task.type)]
    if not typed:
        return Diagnosis(
            Blocker.NO_EXPERT_WITH_TYPE,
            f"no live expert on queue {task.queue!r} has task type {task.type!r} "
            f"(live there: {_names(live)})",
        )
    able = [e for e in typed if e.capabilities.satisfies(task.requirements)]
    if not able:
        return Diagnosis(
            Blocker.NO_EXPERT_WITH_REQUIREMENTS,
            f"no live expert has what it requires ({_wanted(task.requirements)})",
        )
    limited = _held_by_limit(
        task, now, None if task.limit_key is None else (keys or {}).get(task.limit_key)
    )
    if limited is not None:
        return limited
    joining = [e for e in able if not e.standing_by]
    if not joining:
        return Diagnosis(
            Blocker.EMERGENCY_STANDBY,
            f"only emergency experts can run it ({_names(able)}), and they stand by "
            "until the cluster is under pressure",
            tuple(e.name for e in able),
        )
    free = [e for e in joining if e.free > 0]
    if not free:
        return Diagnosis(
            Blocker.ALL_CAPABLE_EXPERTS_BUSY,
            f"every expert that can run it is busy ({_names(joining)})",
            tuple(e.name for e in joining),
        )
    return Diagnosis(
        Blocker.CLAIMABLE,
        f"claimable now: {_names(free)} can run it and {'has' if len(free) == 1 else 'have'} "
        "a free slot",
        tuple(e.name for e in free),
    )


def count_blockers(
    tasks: Iterable[PendingFacts],
    now: float,
    experts: Sequence[ExpertFacts],
    keys: Mapping[str, KeyState] | None = None,
) -> dict[tuple[str, Blocker], int]:
    """How many of *tasks* each reason holds back, by (queue, reason)."""
    counts: dict[tuple[str, Blocker], int] = {}
    for task in tasks:
        d = why_not_running(task, now, experts, keys)
        if d is not None:
            key = (task.queue, d.blocker)
            counts[key] = counts.get(key, 0) + 1
    return counts
