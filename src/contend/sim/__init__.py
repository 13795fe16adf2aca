"""Placement simulation: the real expert's race and auction against a plain queue and a
central planner, in virtual time, through the real memory store."""

from contend.sim.engine import STRATEGIES, simulate
from contend.sim.result import Result, SimConfig
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
