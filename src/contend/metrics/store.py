"""The store's view as Prometheus metrics, for the dashboard's ``/metrics``: tasks by queue and
state, why pending tasks wait, the oldest pending age, and each expert as its heartbeats
published it. Read through the Store port alone, so every backend has them.

A collector's ``collect()`` cannot wait on the store, so :class:`StoreMetrics` is handed a
:class:`StoreSnapshot` (read by the caller, asynchronously, just before a scrape) and reports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from contend.domain.blocking import Blocker
from contend.store.diagnosis import BlockedCounts, blocked_counts
from contend.store.port import Store, StoreStats


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    stats: StoreStats
    blocked: BlockedCounts


async def read_snapshot(store: Store, stats: StoreStats | None = None) -> StoreSnapshot:
    stats = stats or await store.stats()
    blocked = await blocked_counts(store, counts=stats.counts, experts=stats.experts)
    return StoreSnapshot(stats, blocked)


class StoreMetrics(Collector):
    """Reports the last snapshot given to :meth:`update`; :attr:`registry` holds it."""

    def __init__(self) -> None:
        self.snapshot: StoreSnapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def update(self, snapshot: StoreSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        yield from _tasks(snap)
        yield from _experts(snap.stats)


def _tasks(snap: StoreSnapshot) -> Iterator[Metric]:
    stats = snap.stats
    tasks = GaugeMetricFamily(
        "contend_tasks", "Tasks by queue and state", labels=["queue", "state"]
    )
    for queue, states in sorted(stats.counts.items()):
        for state, n in sorted(states.items()):
            tasks.add_metric([queue, state], n)
    blocked = GaugeMetricFamily(
        "contend_pending_blocked",
        "Pending and waiting tasks by why they are not running",
        labels=["queue", "reason"],
    )
    queues = sorted(stats.counts)
    for queue in queues:
        for reason in Blocker:
            blocked.add_metric([queue, str(reason)], snap.blocked.counts.get((queue, reason), 0))
    complete = GaugeMetricFamily(
        "contend_pending_blocked_complete",
        "1 when contend_pending_blocked covers every pending task, 0 when only the oldest",
    )
    complete.add_metric([], 1 if snap.blocked.complete else 0)
    oldest = GaugeMetricFamily(
        "contend_oldest_pending_age_seconds", "How long the oldest due pending task has waited"
    )
    oldest.add_metric([], stats.oldest_pending_age or 0.0)
    done = GaugeMetricFamily(
        "contend_succeeded_last_minute", "Tasks that succeeded in the last 60 seconds"
    )
    done.add_metric([], stats.done_last_minute)
    yield from (tasks, blocked, complete, oldest, done)


def _experts(stats: StoreStats) -> Iterator[Metric]:
    live = GaugeMetricFamily("contend_experts", "Experts by liveness", labels=["state"])
    alive = sum(1 for e in stats.experts if e.alive)
    live.add_metric(["live"], alive)
    live.add_metric(["gone"], len(stats.experts) - alive)
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "load": GaugeMetricFamily("contend_expert_load", "Tasks held", labels=["expert"]),
        "capacity": GaugeMetricFamily("contend_expert_capacity", "Slots", labels=["expert"]),
        "age": GaugeMetricFamily(
            "contend_expert_heartbeat_age_seconds",
            "Seconds since the expert's last heartbeat, by the store's clock",
            labels=["expert"],
        ),
        "window": GaugeMetricFamily(
            "contend_expert_race_window_seconds", "The expert's race window", labels=["expert"]
        ),
        "active": GaugeMetricFamily(
            "contend_expert_emergency_active",
            "1 while an emergency expert has joined in, 0 while it stands by",
            labels=["expert"],
        ),
        "attempts": CounterMetricFamily(
            "contend_expert_claim_attempts", "Claim attempts it published", labels=["expert"]
        ),
        "won": CounterMetricFamily(
            "contend_expert_claims_won", "Claims won it published", labels=["expert"]
        ),
        "done": CounterMetricFamily(
            "contend_expert_tasks_done", "Tasks done it published", labels=["expert"]
        ),
    }
    for e in stats.experts:
        if not e.alive:
            continue
        name = [e.info.id]
        families["load"].add_metric(name, e.load)
        families["capacity"].add_metric(name, e.info.capacity)
        families["age"].add_metric(name, max(0.0, stats.now - e.heartbeat_at))
        if "window" in e.metrics:
            families["window"].add_metric(name, float(str(e.metrics["window"])))
        if e.info.tier == "emergency":
            families["active"].add_metric(name, 1 if e.metrics.get("active") else 0)
        families["attempts"].add_metric(name, e.claim_attempts)
        families["won"].add_metric(name, e.claims_won)
        families["done"].add_metric(name, e.tasks_done)
    rate = GaugeMetricFamily(
        "contend_competition_success_ratio",
        "Claims won over claim attempts, all live experts (the seeds call 0.85-0.95 healthy)",
    )
    attempts = sum(e.claim_attempts for e in stats.experts if e.alive)
    if attempts:
        rate.add_metric([], sum(e.claims_won for e in stats.experts if e.alive) / attempts)
    yield from (live, *families.values(), rate)
