"""Placement simulation: competition against a plain queue, an auction and a central planner,
in virtual time, through the real memory store."""

from contend.sim.engine import STRATEGIES, Result, SimConfig, simulate
from contend.sim.scenario import Job, Kind, Scenario, SimExpert, make_scenario

__all__ = [
    "STRATEGIES",
    "Job",
    "Kind",
    "Result",
    "Scenario",
    "SimConfig",
    "SimExpert",
    "make_scenario",
    "simulate",
]
