"""What the dashboard remembers: one sample of the store's stats a second, for the live
throughput chart and the competition's success rate over time.

The store keeps no time series; the dashboard makes a short one while it runs (the last
:data:`KEEP` samples, ten minutes at one a second), from ``Store.stats()`` alone, so it works
with every backend. Throughput between two samples is the growth of the finished count
(succeeded, failed, dead); the competition's success rate is the growth of claims won over
the growth of claim attempts, summed over the experts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from contend.errors import ContendError
from contend.store.port import Store, StoreStats

log = logging.getLogger("contend.dashboard")

KEEP = 600
#: The most of its time the dashboard spends reading the store's stats: a read that took
#: *t* seconds waits ``t / COST_SHARE`` before the next. ``stats()`` counts every task, and
#: on a large store one read takes a while (0.1 s on PostgreSQL behind 200,000 tasks): at one
#: a second the dashboard would keep a core of its own, or of the store's server, busy.
COST_SHARE = 0.1
FINISHED = ("succeeded", "failed", "dead")


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # the store's clock
    finished: int
    finished_by_queue: dict[str, int]
    attempts: int
    won: int


@dataclass(frozen=True, slots=True)
class Point:
    """One step of the live series."""

    at: float
    throughput: float  # tasks finished per second since the sample before
    success_rate: float | None  # claims won / attempted since the sample before


def sample_of(stats: StoreStats) -> Sample:
    by_queue = {q: sum(c.get(s, 0) for s in FINISHED) for q, c in stats.counts.items()}
    return Sample(
        at=stats.now,
        finished=sum(by_queue.values()),
        finished_by_queue=by_queue,
        attempts=sum(e.claim_attempts for e in stats.experts),
        won=sum(e.claims_won for e in stats.experts),
    )


class Sampler:
    """Samples *store* every *every* seconds while :meth:`run` runs."""

    def __init__(
        self,
        store: Store,
        every: float = 1.0,
        keep: int = KEEP,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.every = every
        #: the time between two samples now: *every*, or longer when a read of the stats
        #: takes more than COST_SHARE of it
        self.period = every
        self.samples: deque[Sample] = deque(maxlen=keep)
        self.last: StoreStats | None = None
        self.taken_at = 0.0  # clock() of the last sample
        self._clock = clock

    async def take(self) -> StoreStats:
        began = self._clock()
        stats = await self.store.stats()
        self.last, self.taken_at = stats, self._clock()
        self.period = max(self.every, (self.taken_at - began) / COST_SHARE)
        self.samples.append(sample_of(stats))
        return stats

    def fresh(self) -> StoreStats | None:
        """The last sample, if it is at most one and a half periods old."""
        if self.last is not None and self._clock() - self.taken_at < 1.5 * self.period:
            return self.last
        return None

    async def run(self) -> None:
        while True:
            try:
                await self.take()
            except ContendError as exc:
                log.warning("dashboard: could not read the store's stats: %s", exc)
            await asyncio.sleep(self.period)

    def points(self) -> list[Point]:
        out: list[Point] = []
        prev: Sample | None = None
        for s in self.samples:
            if prev is not None and s.at > prev.at:
                dt = s.at - prev.at
                tried = s.attempts - prev.attempts
                rate = (s.won - prev.won) / tried if tried > 0 else None
                out.append(Point(s.at, max(0, s.finished - prev.finished) / dt, rate))
            prev = s
        return out

    def queue_throughput(self, window: float = 10.0) -> dict[str, float]:
        """Tasks finished per second in each queue over the last *window* seconds."""
        if len(self.samples) < 2:
            return {}
        last = self.samples[-1]
        first = next((s for s in self.samples if s.at >= last.at - window), self.samples[0])
        if first is last:
            first = self.samples[-2]
        dt = last.at - first.at
        if dt <= 0:
            return {}
        return {
            q: max(0, n - first.finished_by_queue.get(q, 0)) / dt
            for q, n in last.finished_by_queue.items()
        }
