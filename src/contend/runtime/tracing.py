"""OpenTelemetry spans for submit, claim, run and commit, when ``opentelemetry-api`` is
installed (the ``otel`` extra) and the process has set a tracer provider (an SDK
with an exporter). Without either, nothing here costs more than one check.

The submitter's trace context travels in the task (``TaskSpec.trace``: the W3C
``traceparent`` and ``tracestate`` fields, as the global propagator writes them), so the
expert's spans join the submitter's trace, across processes and hosts::

    contend submit resize            (the submitter, PRODUCER)
      ├─ contend claim resize        (the expert: fence, attempt)
      └─ contend run resize          (the expert, CONSUMER: the outcome, an error)
           └─ contend commit resize  (committed, or fenced out)

The expert's side is a :class:`~contend.runtime.hooks.Hook` (:class:`TracingHook`), which an
``Expert`` adds by itself when tracing is on as it starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from contend.errors import FencedOut
from contend.runtime.hooks import Hook, Outcome
from contend.store.port import Claimed, Completion

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # tracing stays off
    trace = None  # type: ignore[assignment]

NAME = "contend"


def enabled() -> bool:
    """True when opentelemetry-api is installed and a tracer provider has been set."""
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, ProxyTracerProvider | trace.NoOpTracerProvider)


@contextmanager
def submit_span(task_type: str) -> Iterator[tuple[Any, dict[str, str] | None]]:
    """A submit span, and the trace context to carry in the task (None when tracing is off)."""
    if not enabled():
        yield None, None
        return
    tracer = trace.get_tracer(NAME)
    with tracer.start_as_current_span(
        f"contend submit {task_type}",
        kind=SpanKind.PRODUCER,
        attributes={"contend.task.type": task_type},
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield span, carrier


def _parent(task: Claimed) -> Any:
    return propagate.extract(dict(task.trace)) if task.trace else None


class TracingHook(Hook):
    """Spans of an expert's claims, runs and commits, children of the submitter's span."""

    def __init__(self, provider: Any = None) -> None:
        self.tracer = trace.get_tracer(NAME, tracer_provider=provider)
        self.runs: dict[str, Any] = {}  # task id -> its run span, while it runs
        self.commits: dict[tuple[str, int], Any] = {}  # (task id, fence) -> its commit span

    def _attributes(self, expert: str, task: Claimed) -> dict[str, Any]:
        return {
            "contend.task.id": task.id,
            "contend.task.type": task.type,
            "contend.task.queue": task.queue,
            "contend.expert": expert,
            "contend.fence": task.fence,
            "contend.attempt": task.attempt,
        }

    def on_claimed(self, expert: str, tasks: Sequence[Claimed], attempted: int) -> None:
        for task in tasks:
            span = self.tracer.start_span(
                f"contend claim {task.type}",
                context=_parent(task),
                attributes=self._attributes(expert, task),
            )
            span.end()

    def before_execute(self, expert: str, task: Claimed) -> None:
        self.runs[task.id] = self.tracer.start_span(
            f"contend run {task.type}",
            context=_parent(task),
            kind=SpanKind.CONSUMER,
            attributes=self._attributes(expert, task),
        )

    def after_execute(
        self,
        expert: str,
        task: Claimed,
        outcome: Outcome,
        seconds: float,
        error: BaseException | None,
    ) -> None:
        span = self.runs.pop(task.id, None)
        if span is None:
            return
        if isinstance(outcome, Completion):
            span.set_attribute("contend.outcome", "succeeded")
        else:
            final = "retry" if outcome.retry_delay is not None else str(outcome.final_state)
            span.set_attribute("contend.outcome", final)
            if error is not None:
                span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, final))
        commit = self.tracer.start_span(
            f"contend commit {task.type}",
            context=trace.set_span_in_context(span),
            attributes=self._attributes(expert, task),
        )
        span.end()
        self.commits[(task.id, task.fence)] = commit

    def on_abandoned(self, expert: str, task: Claimed, reason: str) -> None:
        span = self.runs.pop(task.id, None)
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, f"abandoned: {reason}"))
            span.end()

    def on_committed(self, expert: str, outcome: Outcome) -> None:
        span = self.commits.pop((outcome.task_id, outcome.fence), None)
        if span is not None:
            span.end()

    def on_fenced_out(self, expert: str, outcome: Outcome, refusal: FencedOut) -> None:
        span = self.commits.pop((outcome.task_id, outcome.fence), None)
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, f"fenced out: {refusal.reason}"))
            span.end()

    def on_lease_lost(self, expert: str, reason: str, running: int, dropped: int) -> None:
        """What the lease took with it will never end: end its spans now."""
        for span in [*self.runs.values(), *self.commits.values()]:
            span.set_status(Status(StatusCode.ERROR, f"lease lost: {reason}"))
            span.end()
        self.runs.clear()
        self.commits.clear()
