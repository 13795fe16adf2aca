"""Fitness and the race: how an expert decides how long to wait before it claims.

A fitness function maps (the expert's view of itself, a task) to a score in [0, 1]. In race
mode every expert that could run a task waits ``window × (1 − fitness) × (1 ± jitter)`` and then
tries the atomic claim, so the fittest usually tries first and the store picks one winner.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from contend.domain.task import Capabilities, Requirements


@dataclass(frozen=True, slots=True)
class ExpertView:
    """What an expert knows of itself when it scores a task."""

    name: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    capacity: int = 1
    load: int = 0  # tasks it holds now
    tier: str = "general"
    specialties: frozenset[str] = frozenset()  # task types it is specialised in

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


def default_fitness(expert: ExpertView, task: TaskView) -> float:
    """Capability match (0 when the expert cannot run the task), weighted by load headroom,
    with a bonus for specialists on their own task types."""
    match = expert.capabilities.match_score(task.requirements)
    if match == 0.0:
        return 0.0
    score = match * (0.5 + 0.5 * expert.headroom)
    if task.type in expert.specialties:
        score = min(1.0, score + 0.25)
    return max(0.0, min(1.0, score))


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
    scores a quarter as high, so in a race it waits longer and the fast one claims first."""
    if not fastest > 0:
        raise ValueError(f"fastest must be a positive speed, got {fastest!r}")

    def fitness(expert: ExpertView, task: TaskView) -> float:
        s = speed(expert, task)
        if s <= 0:
            return 0.0
        return max(0.0, min(1.0, base(expert, task) * min(1.0, s / fastest)))

    return fitness
