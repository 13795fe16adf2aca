"""The expert's metrics hook: what it counts on a real expert run (memory store, fake clock),
as Prometheus reads it, and its endpoint over HTTP."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from contend import Expert, TaskState
from contend.metrics import MetricsHook, serve_metrics
from contend.metrics.expert import Histogram
from contend.testing import FakeClock
from tests.unit.fakes import app_on, faulty_memory, running


def samples(hook: MetricsHook) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(hook.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(got: dict, name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))]


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 7.0):
        h.observe(v)
    assert h.buckets() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert h.total == 7.65


async def test_an_expert_run_as_prometheus_reads_it() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    hook = MetricsHook(clock=clock)

    @app.task(queue="q")
    async def slow(x: int) -> int:
        # 0.4, not a bucket's bound: the fake clock's times are sums of floats, and a run from
        # 1.2 to 1.7 lasts 0.5000000000000002 s, which a 0.5 bound leaves out
        await clock.sleep(0.4)
        if x == 3:
            raise ValueError("three")
        return x

    expert = Expert(app, name="m", lease_ttl=3.0, clock=clock, hooks=[hook])
    async with running(expert, clock):
        for n in range(4):
            await app.submit(slow, [n])
        assert await clock.run_until(lambda: expert.stats.tasks_done == 3, limit=30)
        assert await clock.run_until(lambda: hook.heartbeats >= 2, limit=30)
        await clock.run(0.25)
        got = samples(hook)
    e = {"expert": "m"}
    claimed = value(got, "contend_tasks_claimed_total", **e, type="slow", queue="q")
    assert value(got, "contend_claims_total", **e) == claimed >= 4  # the failed one again
    assert value(got, "contend_claim_attempts_total", **e) >= value(
        got, "contend_claims_total", **e
    )
    runs = {
        o: value(got, "contend_task_runs_total", **e, type="slow", queue="q", outcome=o)
        for o in ("succeeded", "retried", "failed", "dead")
    }
    assert runs["succeeded"] == 3 and runs["retried"] >= 1
    count = value(got, "contend_task_duration_seconds_count", **e, type="slow")
    assert count == runs["succeeded"] + runs["retried"] + runs["failed"] + runs["dead"]
    assert value(got, "contend_task_duration_seconds_bucket", **e, type="slow", le="0.1") == 0
    assert value(got, "contend_task_duration_seconds_bucket", **e, type="slow", le="0.5") == count
    assert value(got, "contend_task_duration_seconds_sum", **e, type="slow") == pytest.approx(
        0.4 * count
    )
    # the fake clock's renewals answer at once, one heartbeat (a third of the lease) after
    # the last: what is left is the lease, less its clock-rate margin, less that heartbeat
    assert value(got, "contend_heartbeats_total", **e) == hook.heartbeats
    assert value(got, "contend_lease_margin_seconds", **e) == 3.0 * 0.98 - 1.0
    assert value(got, "contend_lease_margin_min_seconds", **e) <= 3.0 * 0.98 - 1.0
    assert value(got, "contend_heartbeat_lag_seconds", **e) == clock() - hook.last_renewal
    assert value(got, "contend_renewal_seconds_count", **e) == hook.heartbeats
    assert value(got, "contend_leases_lost_total", **e) == 0
    states = [(await store.get(t.id)).state for t in await store.list_tasks()]
    assert states.count(TaskState.SUCCEEDED) == 3


def test_the_endpoint_serves_the_registry_on_loopback() -> None:
    hook = MetricsHook()
    server = serve_metrics(hook.registry, 0)
    try:
        assert server.server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = reply.read().decode()
        assert "contend_claims_total" in body and "contend_lease_margin_seconds" in body
    finally:
        server.close()
