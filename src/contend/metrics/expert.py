"""The expert's Prometheus metrics, as a :class:`~contend.runtime.hooks.Hook`.

The hot moments (a claim and a run's end; it leaves commits alone) only add to plain integers and floats kept
by the hook; nothing is formatted, locked or looked up by label until Prometheus scrapes, when
:class:`ExpertCollector` turns the counts into metric families. The per-task cost this adds is
measured by ``benchmarks/metrics_hook.py`` (docs/metrics.md gives the figure).

A scrape runs on the HTTP server's thread while the hooks run on the expert's event loop:
each number read is whole (the interpreter's lock sees to that), and a scrape that lands
between two additions of one moment sees one of them a scrape early — harmless for counters.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from contend.domain.task import TaskState
from contend.errors import FencedOut
from contend.runtime.hooks import Hook, Outcome
from contend.store.port import Claimed, Completion, Heartbeat

#: Upper bounds of the task duration buckets, seconds (a +Inf bucket follows).
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0)
#: Upper bounds of the renewal round-trip buckets, seconds.
RENEWAL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(slots=True)
class Histogram:
    """Bucket counts and a sum: what a Prometheus histogram needs, and no more."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, as HistogramMetricFamily takes them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), list(self.counts), strict=True):
            running += n
            out.append(("+Inf" if bound == math.inf else repr(bound), running))
        return out


@dataclass(slots=True)
class TypeCounts:
    """The counts of one (task type, queue)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    dead: int = 0
    abandoned: int = 0
    duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))


class MetricsHook(Hook):
    """Counts what one expert does; :attr:`registry` holds the collector that reports it.

    ``Expert(app, hooks=[MetricsHook()])``, then ``serve_metrics(hook.registry, port)``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.expert = ""
        self.types: dict[tuple[str, str], TypeCounts] = {}
        self.claim_attempts = 0
        self.claims_won = 0
        self.stolen = 0
        self.taken_over = 0
        self.fenced_out: dict[str, int] = {}
        self.leases_lost = 0
        self.expired = 0
        self.held = 0
        self.heartbeats = 0
        self.renewal = Histogram(RENEWAL_BUCKETS)
        self.last_renewal: float | None = None  # self.clock() at the last renewal's answer
        self.margin: float | None = None
        self.min_margin: float | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(ExpertCollector(self))

    def _of(self, task: Claimed) -> TypeCounts:
        counts = self.types[(task.type, task.queue)] = TypeCounts()
        return counts

    # -- the hot moments (a claim, a run's end): a few additions each, written out inline ----
    def on_claimed(self, expert: str, tasks: Sequence[Claimed], attempted: int) -> None:
        self.expert = expert
        self.claim_attempts += attempted
        self.claims_won += len(tasks)
        types = self.types
        for task in tasks:
            counts = types.get((task.type, task.queue)) or self._of(task)
            counts.claimed += 1

    def after_execute(
        self,
        expert: str,
        task: Claimed,
        outcome: Outcome,
        seconds: float,
        error: BaseException | None,
    ) -> None:
        counts = self.types.get((task.type, task.queue)) or self._of(task)
        duration = counts.duration
        duration.counts[bisect_left(DURATION_BUCKETS, seconds)] += 1
        duration.total += seconds
        if type(outcome) is Completion:
            counts.succeeded += 1
        elif outcome.retry_delay is not None:  # type: ignore[union-attr]
            counts.retried += 1
        elif outcome.final_state == TaskState.DEAD:  # type: ignore[union-attr]
            counts.dead += 1
        else:
            counts.failed += 1

    # -- the rest ----------------------------------------------------------------------------
    def on_abandoned(self, expert: str, task: Claimed, reason: str) -> None:
        (self.types.get((task.type, task.queue)) or self._of(task)).abandoned += 1

    def on_stolen(self, expert: str, victim: str, tasks: Sequence[Claimed]) -> None:
        self.stolen += len(tasks)

    def on_taken_over(self, expert: str, task_ids: Sequence[str]) -> None:
        self.taken_over += len(task_ids)

    def on_fenced_out(self, expert: str, outcome: Outcome, refusal: FencedOut) -> None:
        reason = refusal.reason or "other"
        self.fenced_out[reason] = self.fenced_out.get(reason, 0) + 1

    def on_heartbeat(self, expert: str, beat: Heartbeat, held: int) -> None:
        self.expert = expert
        self.heartbeats += 1
        self.held = held

    def on_renewal(self, expert: str, seconds: float, margin: float) -> None:
        self.renewal.observe(seconds)
        self.last_renewal = self.clock()
        self.margin = margin
        self.min_margin = margin if self.min_margin is None else min(self.min_margin, margin)

    def on_lease_lost(self, expert: str, reason: str, running: int, dropped: int) -> None:
        self.leases_lost += 1

    def on_expired(self, expert: str, count: int) -> None:
        self.expired += count


def _counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=["expert", *labels])


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["expert", *labels])


class ExpertCollector(Collector):
    """Turns a :class:`MetricsHook`'s counts into metric families at scrape time."""

    def __init__(self, hook: MetricsHook) -> None:
        self.hook = hook

    def collect(self) -> Iterator[Metric]:
        h = self.hook
        e = [h.expert]
        yield from self._claims(h, e)
        yield from self._tasks(h, e)
        fenced = _counter("contend_fenced_out_writes", "Commits the store refused", ["reason"])
        for reason, n in sorted(h.fenced_out.items()):
            fenced.add_metric([*e, reason], n)
        yield fenced
        yield from self._lease(h, e)

    @staticmethod
    def _claims(h: MetricsHook, e: list[str]) -> Iterator[Metric]:
        attempts = _counter("contend_claim_attempts", "Tasks this expert tried to claim")
        attempts.add_metric(e, h.claim_attempts)
        won = _counter("contend_claims", "Tasks this expert claimed (races won)")
        won.add_metric(e, h.claims_won)
        lost = _counter("contend_lost_races", "Claims a rival won first")
        lost.add_metric(e, h.claim_attempts - h.claims_won)
        stolen = _counter("contend_stolen_tasks", "Unstarted tasks this expert took from others")
        stolen.add_metric(e, h.stolen)
        taken = _counter("contend_taken_over_tasks", "Prefetched tasks others took first")
        taken.add_metric(e, h.taken_over)
        yield from (attempts, won, lost, stolen, taken)

    @staticmethod
    def _tasks(h: MetricsHook, e: list[str]) -> Iterator[Metric]:
        claimed = _counter("contend_tasks_claimed", "Tasks claimed", ["type", "queue"])
        ended = _counter(
            "contend_task_runs", "Runs ended, by outcome", ["type", "queue", "outcome"]
        )
        duration = HistogramMetricFamily(
            "contend_task_duration_seconds",
            "Run time of a task, from start to outcome",
            labels=["expert", "type"],
        )
        by_type: dict[str, Histogram] = {}
        for (kind, queue), c in sorted(h.types.items()):
            claimed.add_metric([*e, kind, queue], c.claimed)
            for outcome in ("succeeded", "retried", "failed", "dead", "abandoned"):
                ended.add_metric([*e, kind, queue, outcome], getattr(c, outcome))
            merged = by_type.setdefault(kind, Histogram(DURATION_BUCKETS))
            merged.counts = [a + b for a, b in zip(merged.counts, c.duration.counts, strict=True)]
            merged.total += c.duration.total
        for kind, hist in by_type.items():
            duration.add_metric([*e, kind], hist.buckets(), hist.total)
        held = _gauge("contend_held_tasks", "Tasks the store says this expert holds")
        held.add_metric(e, h.held)
        yield from (claimed, ended, duration, held)

    @staticmethod
    def _lease(h: MetricsHook, e: list[str]) -> Iterator[Metric]:
        renewal = HistogramMetricFamily(
            "contend_renewal_seconds", "Round trip of a lease renewal", labels=["expert"]
        )
        renewal.add_metric(e, h.renewal.buckets(), h.renewal.total)
        beats = _counter("contend_heartbeats", "Successful lease renewals")
        beats.add_metric(e, h.heartbeats)
        lag = _gauge("contend_heartbeat_lag_seconds", "Seconds since the last successful renewal")
        if h.last_renewal is not None:
            lag.add_metric(e, h.clock() - h.last_renewal)
        margin = _gauge(
            "contend_lease_margin_seconds",
            "Lease left when the last renewal answered (0: it would have been lost)",
        )
        low = _gauge("contend_lease_margin_min_seconds", "The smallest lease margin seen")
        if h.margin is not None and h.min_margin is not None:
            margin.add_metric(e, h.margin)
            low.add_metric(e, h.min_margin)
        lost = _counter("contend_leases_lost", "Times this expert lost its lease")
        lost.add_metric(e, h.leases_lost)
        expired = _counter(
            "contend_expired_leases", "Lapsed tasks this expert's housekeeping sent back"
        )
        expired.add_metric(e, h.expired)
        yield from (renewal, beats, lag, margin, low, lost, expired)
