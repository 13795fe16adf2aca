"""Limits per limit key, across all experts and hosts: the rules the stores keep at claim time.

* Concurrency limits: at most K tasks of a key claimed or running at once (Hatchet's
  concurrency keys). A task carries its key and its K from its submission
  (``TaskSpec.limit_key``, ``TaskSpec.concurrency_limit``); :func:`admit` takes a claimable
  task only while its key's claimed and running tasks, plus those the same claim already
  took, number fewer than K.
* Rate limits (celery#5732): the starts of a key spaced by :class:`Rate` (GCRA, one number
  per key); :func:`admit` honours each key's room, :func:`spend` moves its state on.
* Fair share (river#1060): :func:`fair_order` ranks a claim's candidates so that the keys'
  claimed and running counts even out.

The stores that pick in code call these; the SQL stores apply the same rules inside their
claim's transaction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contend.domain.payload import check_name
from contend.errors import TaskError, shown

#: The largest concurrency limit.
MAX_CONCURRENCY_LIMIT = 1_000_000
#: The longest limit key, characters.
MAX_LIMIT_KEY_CHARS = 200


def check_concurrency_limit(key: str | None, limit: int | None) -> tuple[str | None, int | None]:
    """A task's limit key and concurrency limit, checked: both or neither."""
    if key is None and limit is None:
        return None, None
    if key is None or limit is None:
        raise TaskError("a concurrency limit needs both a limit key and a limit")
    return check_limits(key, limit, None, False)[:2]


def check_limits(
    key: str | None, concurrency: int | None, rate: Rate | None, fair: bool
) -> tuple[str | None, int | None, Rate | None, bool]:
    """A task's limit key and what it means, checked: a key needs a concurrency limit, a
    rate limit or fair share (or several), and each of those needs the key."""
    if key is None:
        if concurrency is not None or rate is not None or fair:
            what = (
                "a concurrency limit"
                if concurrency is not None
                else ("a rate limit" if rate is not None else "fair share")
            )
            raise TaskError(f"{what} needs a limit key")
        return None, None, None, False
    check_name(key, "limit key", MAX_LIMIT_KEY_CHARS)
    if concurrency is None and rate is None and not fair:
        raise TaskError(
            f"limit key {shown(key)} needs a concurrency limit, a rate limit or fair share"
        )
    if concurrency is not None and (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY_LIMIT
    ):
        raise TaskError(
            f"a concurrency limit must be a whole number from 1 to {MAX_CONCURRENCY_LIMIT:,}, "
            f"got {shown(concurrency)}"
        )
    if rate is not None and not isinstance(rate, Rate):
        raise TaskError(f"a rate limit must be a Rate, got {shown(rate)}")
    if not isinstance(fair, bool):
        raise TaskError(f"fair must be True or False, got {shown(fair)}")
    return key, concurrency, rate, fair


def admit(
    candidates: Iterable[tuple[str, str | None, int | None]],
    held: Mapping[str, int],
    want: int,
    rooms: Mapping[str, int] | None = None,
) -> list[str]:
    """Of *candidates* (id, limit key, concurrency limit or None), in claim order, the first
    *want* that their keys admit, given *held* (limit key -> tasks of it claimed or running
    now) and *rooms* (rate-limited key -> starts its rate allows now: :meth:`Rate.room`)."""
    taken: dict[str, int] = {}
    out: list[str] = []
    for tid, key, limit in candidates:
        if len(out) >= want:
            break
        if key is not None:
            n = taken.get(key, 0)
            if limit is not None and held.get(key, 0) + n >= limit:
                continue
            if rooms is not None and key in rooms and n >= rooms[key]:
                continue
            taken[key] = n + 1
        out.append(tid)
    return out


# -- rate limits -------------------------------------------------------------------------------

#: The most starts a rate may allow per second, and the longest period it may name.
MAX_RATE_PER_SECOND = 1_000_000.0
MAX_RATE_PERIOD = 86_400.0 * 366
#: The largest burst.
MAX_RATE_BURST = 100_000
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class Rate:
    """A rate limit on a limit key: starts spaced *interval* seconds apart on average, with up
    to *burst* back to back. Kept as GCRA (the generic cell rate algorithm) keeps it: one
    number per key, its *theoretical arrival time* (``tat``), the moment the key's next start
    would be due if every start so far had kept the spacing. A start is allowed at *now* when
    ``tat - (burst - 1) * interval <= now``, and moves ``tat`` to ``max(tat, now) + interval``.
    So in any window of *w* seconds a key starts at most ``burst + w / interval`` tasks."""

    interval: float
    burst: int = 1

    @classmethod
    def of(cls, rate: str | tuple[float, float] | Rate, burst: int = 1) -> Rate:
        """A rate from ``"10/s"``, ``"600/m"``, ``"5/2.5s"``, ``"1000/h"``, ``"10/d"`` or a
        pair (count, period in seconds); raises TaskError naming the problem."""
        if isinstance(rate, Rate):
            return rate
        count, period = _count_and_period(rate)
        if (
            isinstance(burst, bool)
            or not isinstance(burst, int)
            or not 1 <= burst <= MAX_RATE_BURST
        ):
            raise TaskError(
                f"a rate burst must be a whole number from 1 to {MAX_RATE_BURST:,}, "
                f"got {shown(burst)}"
            )
        return cls(period / count, burst)

    @property
    def per_second(self) -> float:
        return 1.0 / self.interval

    def room(self, tat: float | None, now: float) -> int:
        """How many starts the key may have at *now*, its state being *tat* (None: never
        started)."""
        if tat is None or tat <= now:
            return self.burst
        # the slack left below the burst, in whole intervals (a hair of tolerance keeps
        # float noise from refusing a start that is exactly due)
        free = (now + self.burst * self.interval - tat) / self.interval
        return max(0, min(self.burst, math.floor(free + 1e-9)))

    def after(self, tat: float | None, now: float, starts: int) -> float:
        """The key's state after *starts* more starts at *now*."""
        return max(tat if tat is not None else now, now) + starts * self.interval

    def next_start(self, tat: float | None) -> float | None:
        """When the key may start a task again, its state being *tat* (None: at any time)."""
        return None if tat is None else tat - (self.burst - 1) * self.interval

    def full_after(self, now: float) -> float:
        """The smallest ``tat`` at which the key has no room at *now*, for a store that finds
        throttled keys with one comparison: ``tat > now + (burst - 1) * interval``."""
        return now + (self.burst - 1) * self.interval

    def text(self) -> str:
        """How ``tasks show`` and the docs write it."""
        per = self.per_second
        shape = (
            f"{per:g}/s"
            if per >= 1
            else f"{per * 60:g}/m"
            if per * 60 >= 1
            else f"{per * 3600:g}/h"
        )
        return shape if self.burst == 1 else f"{shape} (burst {self.burst})"


@dataclass(frozen=True)
class KeyState:
    """What a store holds of one limit key at a moment (``Store.key_states``): how many of
    its tasks are claimed or running, and its rate with the rate's state, if it has one."""

    held: int = 0
    rate: Rate | None = None
    tat: float | None = None

    def rate_room(self, now: float) -> int | None:
        """Starts the key's rate allows at *now* (None: the key has no rate)."""
        return None if self.rate is None else self.rate.room(self.tat, now)


def _count_and_period(rate: object) -> tuple[float, float]:
    what = f"a rate limit must be 'N/s', 'N/m', 'N/h', 'N/d' or (N, seconds), got {shown(rate)}"
    if isinstance(rate, str):
        count_text, sep, unit = rate.strip().partition("/")
        unit = unit.strip().lower()
        scale = 1.0
        if unit and unit[-1] in _UNITS:
            scale, unit = _UNITS[unit[-1]], unit[:-1]
        try:
            count = float(count_text)
            period = (float(unit) if unit else 1.0) * scale
        except ValueError:
            raise TaskError(what) from None
        if not sep:
            raise TaskError(what)
    elif isinstance(rate, tuple) and len(rate) == 2 and not any(isinstance(x, bool) for x in rate):
        try:
            count, period = float(rate[0]), float(rate[1])
        except (TypeError, ValueError):
            raise TaskError(what) from None
    else:
        raise TaskError(what)
    if not (math.isfinite(count) and math.isfinite(period)) or count <= 0 or period <= 0:
        raise TaskError(f"{what}: both must be positive")
    if period > MAX_RATE_PERIOD or count / period > MAX_RATE_PER_SECOND:
        raise TaskError(
            f"a rate limit must be at most {MAX_RATE_PER_SECOND:,.0f} per second over at most "
            f"a year, got {shown(rate)}"
        )
    return count, period


def rooms(rates: Mapping[str, tuple[Rate, float | None]], now: float) -> dict[str, int]:
    """Limit key -> starts its rate allows at *now*, from (rate, tat) per key."""
    return {k: r.room(tat, now) for k, (r, tat) in rates.items()}


def spend(
    claimed: Iterable[str | None], rates: Mapping[str, tuple[Rate, float | None]], now: float
) -> dict[str, float]:
    """Limit key -> its new ``tat`` after a claim took the tasks whose keys are *claimed*
    (only the keys in *rates*: rate-limited ones)."""
    counts: dict[str, int] = {}
    for key in claimed:
        if key is not None and key in rates:
            counts[key] = counts.get(key, 0) + 1
    return {k: rates[k][0].after(rates[k][1], now, n) for k, n in counts.items()}


# -- fair share --------------------------------------------------------------------------------

#: A fair claim looks at the heads of at most this many keys of a queue (after a rotating
#: start, so that with more keys each gets its turn across claims).
FAIR_KEYS = 32


@dataclass(frozen=True)
class FairCandidate:
    """A claimable task of a fair queue, as a fair claim ranks it."""

    id: str
    key: str | None  # its fair key; None: a task without one (they share one turn)
    priority: int
    eff_priority: int
    run_at: float


def fair_order(heads: Iterable[FairCandidate], running: Mapping[str, int], want: int) -> list[str]:
    """The first *want* of *heads* (each key's claimable tasks in claim order) in fair order:
    by base priority first (a more urgent task still goes first, whoever's it is), then so as
    to even out the keys' claimed and running tasks (*running*; a key's n-th head counts as
    ``running + n``), then by effective priority and due time. One tenant's burst thus takes
    no more than its share of the slots while another has work waiting (river#1060)."""
    rank: dict[str | None, int] = {}
    scored = []
    for c in heads:
        n = rank.get(c.key, 0)
        rank[c.key] = n + 1
        load = n + (running.get(c.key, 0) if c.key is not None else 0)
        scored.append((-c.priority, load, -c.eff_priority, c.run_at, c.id))
    scored.sort()
    return [s[-1] for s in scored[:want]]
