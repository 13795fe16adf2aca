"""Periodic tasks: when a schedule ticks, which ticks to run after a gap, and how a tick is
named so that it runs once however many experts schedule it.

Every expert whose app has a periodic task submits each tick itself, with the tick's
idempotency key (:func:`tick_key`); the store keeps one task per key, so the tick becomes one
task whichever experts are alive, and the death of any of them loses nothing. Ticks are times
on the wall clock: an interval is aligned to the epoch (``every=60`` ticks at each whole
minute on every host alike), a cron expression is read in its time zone (croniter).

After a gap in which no expert was running (or this one slept), the *catch-up* policy says
which of the ticks missed within ``catch_up_window`` still run: ``"skip"`` none, ``"latest"``
the most recent one once (the default), ``"all"`` each of them, oldest first, at most
:data:`MAX_CATCH_UP`. A tick that did run keeps its key for as long as the store keeps the
task, so catching up never runs it twice while the window is shorter than the retention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from contend.errors import ConfigError, install_line

CATCH_UP = ("skip", "latest", "all")
DEFAULT_CATCH_UP = "latest"
#: How far back a starting expert looks for missed ticks, seconds (one day).
DEFAULT_CATCH_UP_WINDOW = 86_400.0
#: The most missed ticks one catch-up submits.
MAX_CATCH_UP = 1000
#: The shortest interval, seconds: a tick is named to the second.
MIN_EVERY = 1
#: Ticks are looked for at most this far ahead (a cron expression that never matches).
HORIZON = 366 * 86_400.0


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a periodic task ticks: every *every* seconds, or by a *cron* expression."""

    every: int | None = None
    cron: str | None = None
    tz: str = "UTC"
    catch_up: str = DEFAULT_CATCH_UP
    catch_up_window: float = DEFAULT_CATCH_UP_WINDOW

    @classmethod
    def build(
        cls,
        *,
        every: float | None = None,
        cron: str | None = None,
        tz: str = "UTC",
        catch_up: str = DEFAULT_CATCH_UP,
        catch_up_window: float = DEFAULT_CATCH_UP_WINDOW,
    ) -> Schedule:
        """A checked schedule; a clear ConfigError names what is wrong."""
        if (every is None) == (cron is None):
            raise ConfigError("a periodic task needs one of every=SECONDS or cron='EXPRESSION'")
        whole: int | None = None
        if every is not None:
            if (
                isinstance(every, bool)
                or not isinstance(every, int | float)
                or not math.isfinite(every)
                or every < MIN_EVERY
                or every != int(every)
            ):
                raise ConfigError(
                    f"every must be a whole number of seconds, at least {MIN_EVERY}, got {every!r}"
                )
            whole = int(every)
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"unknown time zone {tz!r} (an IANA name such as 'UTC')") from None
        if catch_up not in CATCH_UP:
            raise ConfigError(f"catch_up must be one of {', '.join(CATCH_UP)}, got {catch_up!r}")
        if (
            isinstance(catch_up_window, bool)
            or not isinstance(catch_up_window, int | float)
            or not 0 <= catch_up_window <= 30 * 86_400
        ):
            raise ConfigError(
                f"catch_up_window must be between 0 and 30 days in seconds, got {catch_up_window!r}"
            )
        schedule = cls(whole, cron, tz, catch_up, float(catch_up_window))
        if cron is not None:
            if not isinstance(cron, str):
                raise ConfigError(f"cron must be a string, got {cron!r}")
            _cron_next(cron, tz)(0.0)  # parses it, or says why not
        return schedule

    def describe(self) -> str:
        if self.every is not None:
            return f"every {self.every}s"
        return f"cron {self.cron!r}" + ("" if self.tz == "UTC" else f" ({self.tz})")

    def after(self, t: float) -> float | None:
        """The first tick strictly after *t* (seconds since the epoch); None if there is none
        within a year."""
        if self.every is not None:
            return (math.floor(t / self.every) + 1) * self.every
        assert self.cron is not None
        tick = _cron_next(self.cron, self.tz)(t)
        return tick if tick - t <= HORIZON else None

    def ticks(self, start: float, end: float, limit: int = MAX_CATCH_UP) -> list[float]:
        """Ticks in ``(start, end]``, oldest first, at most *limit* (the newest ones)."""
        out: list[float] = []
        if self.every is not None:
            first = math.floor(start / self.every) + 1
            last = math.floor(end / self.every)
            first = max(first, last - limit + 1)
            return [n * self.every for n in range(first, last + 1)]
        t = start
        nxt = _cron_next(self.cron or "", self.tz)
        while (t := nxt(t)) <= end:
            out.append(t)
            if len(out) > limit:
                out.pop(0)
        return out

    def missed(self, last: float, now: float) -> list[float]:
        """The ticks to run now for those in ``(last, now]`` that did not run (none looked
        for before ``now − catch_up_window``), by the catch-up policy."""
        start = max(last, now - self.catch_up_window)
        if self.catch_up == "skip" or start >= now:
            return []
        if self.catch_up == "latest":
            return self.ticks(start, now, 1)
        return self.ticks(start, now)


def tick_key(name: str, tick: float) -> str:
    """The idempotency key of one tick of the periodic task type *name*."""
    return f"periodic:{name}:{tick_time(tick)}"


def tick_time(tick: float) -> str:
    """A tick as ISO 8601 in UTC, to the second: ``2026-12-01T18:05:00Z``."""
    return datetime.fromtimestamp(round(tick), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cron_next(expression: str, tz: str) -> Callable[[float], float]:
    """A function from a time to the next time *expression* matches after it, in *tz*."""
    try:
        from croniter import croniter  # type: ignore[import-untyped]
    except ImportError:
        raise ConfigError(
            f"cron schedules need the croniter package: {install_line('cron')} "
            "(or use every=SECONDS)"
        ) from None
    zone = ZoneInfo(tz)
    if not croniter.is_valid(expression):
        raise ConfigError(
            f"not a cron expression: {expression!r} (five fields: minute hour day month weekday)"
        )

    def nxt(t: float) -> float:
        base = datetime.fromtimestamp(t, zone)
        return float(croniter(expression, base).get_next(float))

    return nxt
