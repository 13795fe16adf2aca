"""The executor on a memory store and a fake clock: outcomes, timeouts, checkpoints, stopping."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from typing import Any

import pytest

from contend import App, FencedOut, RetryPolicy, TaskContext, TaskState
from contend.domain.task import Capabilities
from contend.runtime.competition import TypeTracker
from contend.runtime.executor import Executor, build_failure
from contend.runtime.hooks import Hooks, Outcome
from contend.runtime.session import Session
from contend.store.memory import MemoryStore
from contend.store.port import Claimed, Completion, ExpertInfo, Failure
from contend.testing import FakeClock
from tests.unit.fakes import Recorder

TTL = 60.0


class Bench:
    def __init__(self) -> None:
        self.clock = FakeClock(0.0)
        self.store = MemoryStore(clock=self.clock)
        self.app = App("memory://", store_factory=lambda url: self.store)
        self.hook = Recorder(self.clock)
        self.sent: list[tuple[Outcome, Session]] = []
        self.frees = 0
        self.tracker = TypeTracker()
        self.executor = Executor(
            self.store,
            "x",
            self.app.tasks,
            concurrency=2,
            clock=self.clock,
            hooks=Hooks([self.hook]),
            tracker=self.tracker,
            deliver=lambda o, s: self.sent.append((o, s)),
            on_free=self._free,
        )
        self.session: Session | None = None

    def _free(self) -> None:
        self.frees += 1

    async def claim(self, task: str, *args: Any) -> tuple[Claimed, Session]:
        if self.session is None:
            sid = await self.store.register_expert(ExpertInfo("x"), TTL)
            self.session = Session(sid, TTL, self.clock, self.clock.monotonic())
        await self.store.submit([self.app.build_spec(task, list(args))])
        (c,) = await self.store.claim(
            "x", self.session.id, ["default"], Capabilities(), limit=1, lease_ttl=TTL
        )
        return c, self.session

    async def launch(self, task: str, *args: Any) -> Claimed:
        c, session = await self.claim(task, *args)
        self.executor.launch(c, session)
        await self.clock.settle()
        return c

    def failure(self) -> dict[str, Any]:
        ((outcome, _),) = self.sent
        assert isinstance(outcome, Failure)
        body: dict[str, Any] = json.loads(outcome.error_json)
        return body


@pytest.fixture
def bench() -> Bench:
    return Bench()


async def test_an_async_task_times_out_on_the_clock(bench: Bench) -> None:
    cancelled = asyncio.Event()

    @bench.app.task(timeout=5.0, retries=RetryPolicy(max_attempts=3, backoff=2.0, jitter=0.0))
    async def stuck() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    c = await bench.launch("stuck")
    await bench.clock.run(4.99)
    assert bench.sent == [] and bench.executor.load == 1
    await bench.clock.run(0.01)
    ((outcome, session),) = bench.sent
    assert session is bench.session and cancelled.is_set()
    assert isinstance(outcome, Failure) and outcome.retry_delay == 2.0  # retried after backoff
    assert bench.failure() == {
        "type": "Timeout",
        "message": "task exceeded its 5.0s timeout",
        "attempt": 1,
    }
    ((_, task, sent, seconds, error),) = bench.hook.of("after_execute")
    assert (task, sent, seconds) == (c, outcome, 5.0) and isinstance(error, TimeoutError)
    assert bench.executor.load == 0 and bench.frees == 1
    assert bench.tracker.snapshot()["stuck"].failed == 1


async def test_a_sync_task_past_its_timeout_is_told_to_stop(bench: Bench) -> None:
    gate = threading.Event()
    seen: list[TaskContext] = []

    @bench.app.task(timeout=2.0)
    def blocking(ctx: TaskContext) -> str:
        seen.append(ctx)
        gate.wait(10)
        return "late"

    await bench.launch("blocking")
    await bench.clock.run(2.0)
    gate.set()
    assert bench.failure()["type"] == "Timeout"
    assert seen[0].cancelled  # a thread cannot be interrupted: it is told to stop
    bench.executor.shutdown()


async def test_results_and_errors_become_outcomes(bench: Bench) -> None:
    @bench.app.task
    async def add(a: int, b: int) -> int:
        return a + b

    c = await bench.launch("add", 2, 3)
    ((outcome, _),) = bench.sent
    assert outcome == Completion(c.id, c.fence, "5")
    assert bench.hook.of("before_execute") == [("x", c)]

    @bench.app.task(retries=RetryPolicy(max_attempts=4, dont_retry_on=(ValueError,)))
    def strict() -> None:
        raise ValueError("bad")

    bench.sent.clear()
    await bench.launch("strict")
    await bench.clock.run_until(lambda: bool(bench.sent), limit=1)
    body = bench.failure()
    assert (body["type"], body["message"]) == ("ValueError", "bad")
    assert "Traceback" in body["traceback"]
    assert bench.sent[0][0].retry_delay is None  # type: ignore[union-attr]
    assert bench.sent[0][0].final_state == TaskState.FAILED  # type: ignore[union-attr]
    bench.executor.shutdown()


async def test_an_unknown_task_type_fails_without_a_retry(bench: Bench) -> None:
    bench.app.task(lambda: None, name="known")
    c, session = await bench.claim("known")
    bench.executor.launch(dataclasses.replace(c, type="ghost"), session)
    await bench.clock.settle()
    assert bench.failure()["type"] == "UnknownTaskType"
    assert bench.sent[0][0].final_state == TaskState.FAILED  # type: ignore[union-attr]


async def test_checkpoints_land_under_a_safe_session_only(bench: Bench) -> None:
    step = asyncio.Event()
    refused: list[FencedOut] = []

    @bench.app.task
    async def saver(ctx: TaskContext) -> None:
        await ctx.checkpoint({"step": 1})
        await step.wait()
        try:
            await ctx.checkpoint({"step": 2})
        except FencedOut as exc:
            refused.append(exc)
            raise

    c = await bench.launch("saver")
    assert (await bench.store.get(c.id)).checkpoint == {"step": 1}
    assert bench.session is not None
    bench.clock.advance(TTL)  # a whole lease without a renewal: not safe any more
    step.set()
    await bench.clock.settle()
    assert refused and "lease lapsed" in str(refused[0])
    assert (await bench.store.get(c.id)).checkpoint == {"step": 1}


async def test_abandoning_a_session_stops_its_runs_and_sends_nothing(bench: Bench) -> None:
    @bench.app.task
    async def forever() -> None:
        await asyncio.Event().wait()

    a = await bench.launch("forever")
    b = await bench.launch("forever")
    assert bench.session is not None
    other = Session("other", TTL, bench.clock, 0.0)
    assert bench.executor.abandon_session(other, "not this one") == 0
    assert bench.executor.abandon_session(bench.session, "the lease was lost") == 2
    await bench.clock.settle()
    assert bench.sent == [] and bench.executor.load == 0
    assert [(t.id, why) for _, t, why in bench.hook.of("on_abandoned")] == [
        (a.id, "the lease was lost"),
        (b.id, "the lease was lost"),
    ]
    assert bench.hook.of("after_execute") == []


async def test_retain_stops_runs_the_store_no_longer_gives_us(bench: Bench) -> None:
    @bench.app.task
    async def forever() -> None:
        await asyncio.Event().wait()

    a = await bench.launch("forever")
    b = await bench.launch("forever")
    sent = bench.clock.monotonic()
    bench.executor.retain({}, sent)  # a renewal sent as they were launched: it may not know them
    assert set(bench.executor.runs) == {a.id, b.id}
    bench.clock.advance(1.0)
    bench.executor.retain({a.id: a.fence, b.id: b.fence + 1}, bench.clock.monotonic())
    assert set(bench.executor.runs) == {a.id}
    bench.executor.abandon_session(bench.session, "done")  # type: ignore[arg-type]
    await bench.clock.settle()


async def test_drain_waits_out_the_grace_then_stops_the_rest(bench: Bench) -> None:
    @bench.app.task
    async def takes(seconds: float) -> float:
        await bench.clock.sleep(seconds)
        return seconds

    await bench.launch("takes", 1.0)
    slow = await bench.launch("takes", 100.0)
    grace = [5.0]
    drain = asyncio.create_task(bench.executor.drain(lambda: grace[0]))
    await bench.clock.run(1.0)
    assert len(bench.sent) == 1 and not drain.done()  # the quick one finished in time
    await bench.clock.run(3.0)
    assert not drain.done()
    grace[0] = 0.0  # a second signal cuts the grace short
    bench.executor.hurry()
    await bench.clock.settle()
    (left,) = drain.result()
    assert left.claimed == slow and len(bench.sent) == 1


def test_build_failure_carries_the_policys_decision() -> None:
    c = Claimed("t", "k", "default", [], {}, 3, 2, 2, None, None, 0.0)
    spent = build_failure(c, "Boom", "x" * 5000, policy=RetryPolicy(max_attempts=2))
    assert (spent.task_id, spent.fence, spent.retry_delay) == ("t", 3, None)
    assert spent.final_state == TaskState.DEAD
    body = json.loads(spent.error_json)
    assert len(body["message"]) == 4000 and body["attempt"] == 2 and "traceback" not in body
    # the task's own max_attempts (as submitted) counts, not the policy's
    assert build_failure(c, "Boom", "x", policy=RetryPolicy(max_attempts=5)).retry_delay is None
    more = Claimed("t", "k", "default", [], {}, 3, 2, 5, None, None, 0.0)
    again = build_failure(more, "Boom", "x", policy=RetryPolicy(jitter=0.0))
    assert again.retry_delay == 2.0  # attempt 2 of 5: backoff × factor
    final = build_failure(c, "PayloadError", "too big", policy=None, tb="tb")
    assert (final.retry_delay, final.final_state) == (None, TaskState.FAILED)
    assert json.loads(final.error_json)["traceback"] == "tb"


async def test_a_finished_run_leaves_no_reference_cycle(bench: Bench) -> None:
    """Each run and its context pointed at each other: every task left a cycle (run, context,
    asyncio task, coroutine) that only the garbage collector could free, which cost an expert
    on SQLite about a fifth more CPU per task. A context kept past its run refuses checkpoints."""
    import gc

    kept: list[TaskContext] = []

    @bench.app.task
    async def job(ctx: TaskContext) -> int:
        kept.append(ctx)
        return 1

    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            await bench.launch("job")
        assert len(bench.sent) == 20
        bench.sent.clear()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert "Run" not in cyclic and "TaskContext" not in cyclic
    with pytest.raises(FencedOut, match="the run has ended"):
        await kept[0].checkpoint({"late": True})


async def test_a_run_past_its_deadline_stops_before_the_watchdog_says_so(bench: Bench) -> None:
    """A process paused past its lease (SIGSTOP, a frozen VM) resumes with every timer
    overdue, and a task may get the loop before the watchdog does. ``ctx.check()`` and
    ``ctx.cancelled`` look at the lease deadline themselves, so that the task takes no step
    (no side effect) once its lease is gone; its run is abandoned, nothing is sent. Found by
    the chaos suite (sigstop): one more step after SIGCONT, while a rival ran the task."""
    effects: list[int] = []
    resume = asyncio.Event()
    seen: list[TaskContext] = []

    @bench.app.task
    async def careful(ctx: TaskContext) -> None:
        seen.append(ctx)
        for step in range(3):
            await resume.wait()
            ctx.check()  # before each side effect
            effects.append(step)
            resume.clear()

    c = await bench.launch("careful")
    resume.set()
    await bench.clock.settle()
    assert effects == [0] and not seen[0].cancelled
    bench.clock.advance(TTL)  # paused past the lease; no watchdog has run yet
    assert seen[0].cancelled
    resume.set()
    await bench.clock.settle()
    assert effects == [0]  # no step past the deadline
    assert bench.sent == [] and bench.executor.load == 0
    ((_, task, why),) = bench.hook.of("on_abandoned")
    assert task == c and "lease" in why
    assert bench.hook.of("after_execute") == []


async def test_a_run_launched_past_its_deadline_never_starts(bench: Bench) -> None:
    """A task held ahead for a slot may be launched after its lease ran out, before the
    watchdog has said so (a paused process resumes with every timer overdue, and a run that
    ends frees a slot first): its body must not run, a rival may own the task by then."""
    ran: list[str] = []

    @bench.app.task
    async def note() -> None:
        ran.append("ran")

    c, session = await bench.claim("note")
    bench.clock.advance(TTL)  # paused past the lease; no watchdog has run yet
    bench.executor.launch(c, session)
    await bench.clock.settle()
    assert ran == [] and bench.sent == [] and bench.executor.load == 0
    ((_, task, why),) = bench.hook.of("on_abandoned")
    assert task == c and "lease" in why
    assert bench.hook.of("after_execute") == []
