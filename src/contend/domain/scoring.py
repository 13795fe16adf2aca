"""Fitness and the race: how an expert decides how long to wait before it claims.

A fitness function maps (the expert's view of itself, a task) to a score in [0, 1]. In race
mode every expert that could run a task waits ``window × (1 − fitness) × (1 ± jitter)`` and then
tries the atomic claim, so the fittest usually tries first and the store picks one winner.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contend.domain.task import Capabilities, Requirements


@dataclass(frozen=True, slots=True)
class TypeRecord:
    """An expert's past on one task type: results and mean run time."""

    done: int = 0
    failed: int = 0
    mean_seconds: float | None = None

    @property
    def runs(self) -> int:
        return self.done + self.failed

    @property
    def success_rate(self) -> float:
        return self.done / self.runs if self.runs else 1.0


#: Below this many runs an expert's record on a type is not trusted (it scores as neutral).
MIN_RUNS = 3


@dataclass(frozen=True, slots=True)
class ExpertView:
    """What an expert knows of itself (or of a rival, from its heartbeats) when it scores."""

    name: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    capacity: int = 1
    load: int = 0  # tasks it holds now
    tier: str = "general"
    specialties: frozenset[str] = frozenset()  # task types it is specialised in
    history: Mapping[str, TypeRecord] = field(default_factory=dict)
    #: the fastest known mean run time of each task type across the cluster
    typical_seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def headroom(self) -> float:
        return max(0.0, 1.0 - self.load / max(1, self.capacity))


@dataclass(frozen=True, slots=True)
class TaskView:
    """What a scorer may look at: no payload, only routing facts."""

    id: str
    type: str
    queue: str
    priority: int
    requirements: Requirements
    created_at: float


Fitness = Callable[[ExpertView, TaskView], float]

F = TypeVar("F", bound=Callable[..., Any])


def by_shape(fn: F) -> F:
    """Mark a fitness (or speed) function that reads of a task only its *shape* — type, queue,
    priority and requirements, never its id or age — so that two tasks of one shape score
    the same for any one expert. An expert then scores its rivals once per shape between two
    heartbeats instead of once per candidate task (``Competition.plan``), which is what keeps
    a race affordable among hundreds of rivals. Unmarked functions are scored per task."""
    # a function attribute (as functools.wraps sets __wrapped__): kept with the function
    fn.__dict__["contend_by_shape"] = True
    return fn


def scores_by_shape(fn: Callable[..., Any]) -> bool:
    """Whether *fn* was marked with :func:`by_shape`."""
    return getattr(fn, "__dict__", {}).get("contend_by_shape") is True


def shape_of(task: TaskView) -> Hashable:
    """What a :func:`by_shape` function may read of *task*, as a hashable key."""
    req = task.requirements
    return (
        task.type,
        task.queue,
        task.priority,
        req.tags,
        tuple(sorted(req.resources.items())),
        req.prefer,
    )


def identity_of(task: TaskView) -> Hashable:
    """Everything a fitness function may read of *task*, as a hashable key."""
    return (shape_of(task), task.id, task.created_at)


#: The share of a perfect score that only a specialist on the task's type reaches. (A bonus
#: added and capped at 1 was worth nothing against an idle generalist that fits exactly.)
SPECIALIST_EDGE = 0.2


@by_shape
def default_fitness(expert: ExpertView, task: TaskView) -> float:
    """The product of:

    * capability match — 0 when the expert cannot run the task at all, lower when it offers
      much more than asked (keep big machines for big tasks);
    * load headroom — an idle expert scores up to twice a full one;
    * past success on this task type — ``0.3 + 0.7 × success rate``;
    * speed on this task type — the cluster's fastest mean run time over this expert's;
    * locality — 0.6 when the task prefers tags (a zone, a host) the expert lacks;

    all scaled into ``[0, 1 − SPECIALIST_EDGE]``; a specialist on its own task types gets the
    edge on top, so that it beats an equally placed generalist even when both are idle and
    fit exactly. An expert with fewer than ``MIN_RUNS`` runs of a type scores neutral on
    success and speed, so newcomers get tried.
    """
    match = expert.capabilities.match_score(task.requirements)
    if match == 0.0:
        return 0.0
    score = match * (0.5 + 0.5 * expert.headroom)
    record = expert.history.get(task.type)
    if record is not None and record.runs >= MIN_RUNS:
        score *= 0.3 + 0.7 * record.success_rate
        typical = expert.typical_seconds.get(task.type)
        if typical and record.mean_seconds:
            score *= max(0.05, min(1.0, typical / record.mean_seconds))
    if task.requirements.prefer and not task.requirements.prefer <= expert.capabilities.tags:
        score *= 0.6
    score = max(0.0, min(1.0, score)) * (1.0 - SPECIALIST_EDGE)
    if task.type in expert.specialties:
        score += SPECIALIST_EDGE
    return score


def adaptive_window(base: float, cluster_load: float) -> float:
    """Seed 000 §4.1: ``base × (1 + load / 0.8)``; load is the cluster's utilisation in [0, 1]."""
    return base * (1.0 + max(0.0, min(1.0, cluster_load)) / 0.8)


def race_delay(
    window: float,
    fitness: float,
    jitter: float = 0.1,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before trying to claim; 0 for a perfect fit."""
    fitness = max(0.0, min(1.0, fitness))
    if fitness >= 1.0 or window <= 0:
        return 0.0
    return window * (1.0 - fitness) * (1.0 + jitter * (2.0 * rand() - 1.0))


#: How fast an expert runs a task's type: 1.0 is normal, 4.0 four times faster, 0 cannot.
Speed = Callable[[ExpertView, TaskView], float]


def speed_fitness(speed: Speed, fastest: float, base: Fitness = default_fitness) -> Fitness:
    """A fitness that also prefers the expert that finishes the task type soonest: *base*
    (capability match, headroom, specialty) scaled by this expert's speed on the task's type
    over *fastest*, the highest speed any expert has. An expert four times slower than the best
    scores a quarter as high, so in a race it waits longer and the fast one claims first.
    It scores :func:`by_shape` when *speed* and *base* both do."""
    if not fastest > 0:
        raise ValueError(f"fastest must be a positive speed, got {fastest!r}")

    def fitness(expert: ExpertView, task: TaskView) -> float:
        s = speed(expert, task)
        if s <= 0:
            return 0.0
        return max(0.0, min(1.0, base(expert, task) * min(1.0, s / fastest)))

    return by_shape(fitness) if scores_by_shape(speed) and scores_by_shape(base) else fitness
