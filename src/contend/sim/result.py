"""What a placement simulation is configured with and what it reports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contend.sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Settings of the competing experts (the yardsticks ignore them but the seed)."""

    window: float = 0.05  # race window and auction bidding window, seconds
    jitter: float = 0.1
    heartbeat: float = 5.0  # how often an expert renews, publishing its load, and hears rivals'
    seed: int = 1


@dataclass(slots=True)
class Result:
    """What one strategy achieved on one scenario."""

    strategy: str
    scenario: str
    experts: int
    slots: int
    tasks: int
    makespan: float  # first arrival to last completion, virtual seconds
    mean_completion: float  # mean of (completion - arrival), virtual seconds
    p95_completion: float
    claim_calls: int  # calls to store.claim
    claim_attempts: int  # tasks asked for: every id named; a claim of the best: what it got
    claims_won: int
    lost_races: int  # tasks asked for that came back taken: someone else claimed first
    bids: int
    events: int  # moments of virtual time the simulation stopped at
    wall_seconds: float  # real time the simulation took (not virtual time)
    cpu_seconds: float  # CPU time of this process for it: steadier on a shared machine
    #: CPU time from the first arrival to the last completion: the work's cost, without the
    #: cluster's start, warm-up and stop (for the modelled yardsticks, all of it)
    work_cpu_seconds: float

    @property
    def claims_per_task(self) -> float:
        return self.claim_attempts / self.tasks if self.tasks else 0.0

    @property
    def lost_share(self) -> float:
        return self.lost_races / self.claim_attempts if self.claim_attempts else 0.0

    @property
    def success(self) -> float:
        """Claims won / claim attempts (every task id named), as ``contend status`` shows."""
        return self.claims_won / self.claim_attempts if self.claim_attempts else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "scenario": self.scenario,
            "experts": self.experts,
            "slots": self.slots,
            "tasks": self.tasks,
            "makespan": round(self.makespan, 4),
            "mean_completion": round(self.mean_completion, 4),
            "p95_completion": round(self.p95_completion, 4),
            "claim_calls": self.claim_calls,
            "claim_attempts": self.claim_attempts,
            "claims_won": self.claims_won,
            "lost_races": self.lost_races,
            "claims_per_task": round(self.claims_per_task, 4),
            "success": round(self.success, 4),
            "bids": self.bids,
            "events": self.events,
            "wall_seconds": round(self.wall_seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "work_cpu_seconds": round(self.work_cpu_seconds, 3),
        }


def check_runnable(sc: Scenario) -> None:
    """Refuse a scenario with a task no expert can run (it would never finish)."""
    stuck = [j for j in sc.jobs if not any(sc.can_run(e, j.kind) for e in sc.experts)]
    if stuck:
        raise RuntimeError(f"{len(stuck)} task(s) never ran: no expert can run them")


def summarise(
    sc: Scenario,
    strategy: str,
    finish: Mapping[str, float],
    *,
    claim_calls: int,
    claim_attempts: int,
    claims_won: int,
    lost_races: int,
    bids: int,
    events: int,
    wall: float,
    cpu: float,
    work_cpu: float | None = None,
) -> Result:
    """The result of a run from each task's completion time and the run's counters."""
    if len(finish) != len(sc.jobs):
        raise RuntimeError(
            f"{len(sc.jobs) - len(finish)} task(s) never ran: no expert can run them"
        )
    waits = sorted(finish[j.id] - j.arrival for j in sc.jobs)
    n = len(waits)
    start = min((j.arrival for j in sc.jobs), default=0.0)
    return Result(
        strategy=strategy,
        scenario=sc.name,
        experts=len(sc.experts),
        slots=sc.slots,
        tasks=n,
        makespan=max(finish.values(), default=start) - start,
        mean_completion=sum(waits) / n if n else 0.0,
        p95_completion=waits[min(n - 1, int(0.95 * n))] if n else 0.0,
        claim_calls=claim_calls,
        claim_attempts=claim_attempts,
        claims_won=claims_won,
        lost_races=lost_races,
        bids=bids,
        events=events,
        wall_seconds=wall,
        cpu_seconds=cpu,
        work_cpu_seconds=cpu if work_cpu is None else work_cpu,
    )
