"""OpenTelemetry: with a tracer provider set, a submit span's context travels in the task and
the expert's claim, run and commit spans join the submitter's trace; without one, nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from contend import Expert
from contend.runtime import tracing
from contend.testing import FakeClock
from tests.unit.fakes import app_on, faulty_memory, running


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A real SDK provider for this test alone (the API lets a process set one only once: the
    test puts the API's own state back afterwards)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = before
        provider.shutdown()


def test_tracing_is_off_until_a_provider_is_set() -> None:
    assert not tracing.enabled()
    with tracing.submit_span("x") as (span, carrier):
        assert span is None and carrier is None


async def test_the_expert_s_spans_join_the_submitter_s_trace(spans: InMemorySpanExporter) -> None:
    assert tracing.enabled()
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)

    @app.task
    async def work(x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x

    expert = Expert(app, name="t", lease_ttl=30.0, clock=clock)
    assert any(isinstance(h, tracing.TracingHook) for h in expert.hooks.hooks)
    async with running(expert, clock):
        ok = await app.submit(work, [1])
        bad = await app.submit(work, [-1])
        assert (await store.get(ok.id)).trace is not None
        assert await clock.run_until(
            lambda: expert.stats.tasks_done == 1 and expert.stats.claims_won >= 2, limit=30
        )
        await clock.run(1.0)
    got = spans.get_finished_spans()
    submit = next(
        s
        for s in got
        if s.name == "contend submit work" and s.attributes["contend.task.id"] == ok.id
    )
    mine = [s for s in got if s.context.trace_id == submit.context.trace_id]
    names = {s.name for s in mine}
    assert {
        "contend submit work",
        "contend claim work",
        "contend run work",
        "contend commit work",
    } <= names
    run = next(s for s in mine if s.name == "contend run work")
    assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert run.attributes["contend.fence"] == 1 and run.attributes["contend.expert"] == "t"
    commit = next(s for s in mine if s.name == "contend commit work")
    assert commit.parent is not None and commit.parent.span_id == run.context.span_id
    failed = [
        s for s in got if s.name == "contend run work" and s.attributes["contend.task.id"] == bad.id
    ]
    assert failed and failed[0].status.status_code == trace.StatusCode.ERROR
    assert failed[0].events and failed[0].events[0].name == "exception"
