"""What a placement simulation runs: task kinds, heterogeneous experts and a workload.

Everything here is plain data built from a seeded random generator, so one seed always gives
the same scenario.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Kind:
    """A task type: its duration at speed 1, and whether it needs a GPU."""

    name: str
    base: float
    gpu: bool = False
    weight: float = 1.0  # share of the workload


@dataclass(frozen=True, slots=True)
class SimExpert:
    """A simulated expert: slots run in parallel; *speed* per kind (1.0 when absent)."""

    name: str
    slots: int = 1
    gpu: bool = False
    speed: Mapping[str, float] = field(default_factory=dict)

    def speed_on(self, kind: str) -> float:
        return self.speed.get(kind, 1.0)

    @property
    def profile(self) -> tuple[bool, tuple[tuple[str, float], ...]]:
        """Experts with the same profile are interchangeable for placement."""
        return self.gpu, tuple(sorted(self.speed.items()))


@dataclass(frozen=True, slots=True)
class Job:
    """One task of the workload: when it arrives and how big it is (a multiple of the base)."""

    id: str
    kind: str
    arrival: float
    size: float = 1.0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    kinds: Mapping[str, Kind]
    experts: tuple[SimExpert, ...]
    jobs: tuple[Job, ...]

    def duration(self, expert: SimExpert, job: Job) -> float:
        return self.kinds[job.kind].base * job.size / expert.speed_on(job.kind)

    def can_run(self, expert: SimExpert, kind: str) -> bool:
        return expert.gpu or not self.kinds[kind].gpu

    @property
    def slots(self) -> int:
        return sum(e.slots for e in self.experts)


#: The default mix: three CPU kinds and one that needs a GPU.
KINDS: tuple[Kind, ...] = (
    Kind("thumbnail", base=1.0, weight=0.35),
    Kind("transcode", base=4.0, weight=0.20),
    Kind("parse", base=0.5, weight=0.30),
    Kind("infer", base=2.0, gpu=True, weight=0.15),
)

#: How much faster a specialist runs its own kind.
SPECIALIST_SPEED = 4.0


def make_scenario(
    experts: int = 10,
    tasks: int = 1000,
    *,
    arrival: str = "batch",
    load: float = 0.7,
    gpu_share: float = 0.15,
    seed: int = 1,
    kinds: tuple[Kind, ...] = KINDS,
) -> Scenario:
    """Build a scenario.

    A ``gpu_share`` of the experts have a GPU and run the GPU kind ``SPECIALIST_SPEED`` times
    faster; every other expert specialises in one CPU kind (drawn in proportion to that kind's
    share of the work) and runs it ``SPECIALIST_SPEED`` times faster. Experts have 1, 2 or 4
    slots. Task sizes are uniform in [0.5, 1.5] times their kind's base.

    ``arrival="batch"`` submits everything at time 0; ``"stream"`` draws Poisson arrivals at
    ``load`` times the rate the cluster could sustain if every task ran on a specialist.
    """
    if arrival not in ("batch", "stream"):
        raise ValueError(f"arrival must be 'batch' or 'stream', got {arrival!r}")
    if experts < 1 or tasks < 0:
        raise ValueError("a scenario needs at least one expert and no negative task count")
    rng = random.Random(seed)
    by_name = {k.name: k for k in kinds}
    gpu_kinds = [k for k in kinds if k.gpu]
    cpu_kinds = [k for k in kinds if not k.gpu]
    n_gpu = max(1, round(experts * gpu_share)) if gpu_kinds else 0
    cpu_work = [k.weight * k.base for k in cpu_kinds]
    team: list[SimExpert] = []
    for i in range(experts):
        slots = rng.choice((1, 2, 4))
        if i < n_gpu:
            speed = {k.name: SPECIALIST_SPEED for k in gpu_kinds}
            team.append(SimExpert(f"e{i:04d}", slots, gpu=True, speed=speed))
        else:
            kind = rng.choices(cpu_kinds, weights=cpu_work)[0]
            team.append(SimExpert(f"e{i:04d}", slots, speed={kind.name: SPECIALIST_SPEED}))
    rng.shuffle(team)
    names = [k.name for k in kinds]
    weights = [k.weight for k in kinds]
    mean_work = sum(k.weight * k.base for k in kinds) / sum(weights)
    slots = sum(e.slots for e in team)
    rate = load * slots * SPECIALIST_SPEED / mean_work  # tasks per second
    jobs: list[Job] = []
    t = 0.0
    for n in range(tasks):
        if arrival == "stream" and n:
            t += rng.expovariate(rate)
        name = rng.choices(names, weights=weights)[0]
        jobs.append(Job(f"t{n:07d}", name, t, round(rng.uniform(0.5, 1.5), 4)))
    label = f"{experts} experts, {tasks:,} tasks, {arrival}"
    if arrival == "stream":
        label += f" at {load:.0%} load"
    return Scenario(label, by_name, tuple(team), tuple(jobs))
