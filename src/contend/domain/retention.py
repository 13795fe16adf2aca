"""Retention: which finished tasks a store may delete, and the bounds of one pruning pass.

Stores grow with every task (the row, its history, its result). A finished task (succeeded,
failed, dead or cancelled) last changed more than the retention age ago is deleted whole: the
row, its history, its payload and result, its dependency edges. Never one that a waiting task
still waits on: a dependency is settled when it ends, and a waiting task whose dependency is
gone could never be settled. A task's history is capped at its newest ``keep_events`` lines,
so a task that bounces between experts for days does not grow without end. Each pass deletes
at most *limit* tasks, so that it holds the store's locks briefly; housekeeping runs one pass
per heartbeat, ``contend prune`` runs passes until nothing is left.
"""

from __future__ import annotations

import math

from contend.domain.task import TERMINAL_STATES
from contend.errors import ConfigError

#: The states a task may be pruned in.
PRUNABLE_STATES = TERMINAL_STATES
#: Finished tasks are kept this long by default (seconds): a week.
DEFAULT_RETENTION = 7 * 24 * 3600.0
#: History lines kept per task by default (the newest ones).
DEFAULT_KEEP_EVENTS = 100
#: Tasks deleted per pass by default, and the most one pass may take.
DEFAULT_BATCH = 1000
MAX_BATCH = 100_000
#: A store checks histories against the cap at most once in this many seconds. That check
#: cost as much as 40 % of a pass on PostgreSQL (14 ms of 35 for 1,000 tasks), and a pass
#: that is behind runs many times a second; the cap is a bound on growth, not a deadline.
TRIM_EVERY = 1.0


def check_prune(before: float, limit: int, keep_events: int) -> tuple[float, int, int]:
    """The arguments of ``Store.prune``, checked; ConfigError names what is wrong."""
    if isinstance(before, bool) or not isinstance(before, (int, float)) or math.isnan(before):
        raise ConfigError(f"prune: 'before' must be a time in epoch seconds, not {before!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
        raise ConfigError(
            f"prune: limit must be a whole number from 1 to {MAX_BATCH:,}, not {limit!r}"
        )
    if isinstance(keep_events, bool) or not isinstance(keep_events, int) or keep_events < 1:
        raise ConfigError(
            f"prune: keep_events must be a whole number of at least 1, not {keep_events!r}"
        )
    return float(before), limit, keep_events


def check_retention(seconds: float | None) -> float | None:
    """A retention age (seconds; None keeps finished tasks for ever), checked."""
    if seconds is None:
        return None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise ConfigError(
            f"retention must be a number of seconds of 0 or more (or None), not {seconds!r}"
        )
    return float(seconds)
