"""The expert runtime end to end on a real SQLite file, in one process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from contend import (
    App,
    Capabilities,
    Expert,
    ExpertConflict,
    RetryPolicy,
    TaskContext,
    TaskFailed,
    TaskState,
    UnknownTaskType,
    current,
)
from contend.store.registry import make_store
from contend.testing.faults import FaultyStore


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@asynccontextmanager
async def expert(app: App, **config: Any) -> AsyncIterator[Expert]:
    e = Expert(app, **config)
    runner = asyncio.create_task(e.run())
    started = asyncio.create_task(e.started.wait())
    done, _ = await asyncio.wait({runner, started}, return_when=asyncio.FIRST_COMPLETED)
    if runner in done:
        started.cancel()
        runner.result()  # raises what run() raised
    try:
        yield e
    finally:
        e.stop()
        await asyncio.wait_for(runner, 30)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    app = App(f"sqlite:///{tmp_path / 'rt.db'}")
    yield app
    await app.aclose()


async def test_async_and_sync_tasks_run_and_results_come_back(app: App) -> None:
    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task
    def shout(word: str) -> str:
        return word.upper()

    async with expert(app, name="e1"):
        h1 = await app.submit(add, [2, 3])
        h2 = await app.submit("shout", ["hi"])
        assert await h1.result(timeout=10) == 5
        assert await h2 == "HI"
        task = await h1.get()
        assert (task.state, task.attempts, task.fence, task.owner) == (
            TaskState.SUCCEEDED,
            1,
            1,
            None,
        )


async def test_the_task_sees_its_fence_attempt_and_context(app: App) -> None:
    @app.task
    async def who(ctx: TaskContext) -> dict[str, Any]:
        assert current() is ctx
        return {"fence": ctx.fence, "attempt": ctx.attempt, "expert": ctx.expert}

    async with expert(app, name="seer"):
        assert await (await app.submit(who)).result(timeout=10) == {
            "fence": 1,
            "attempt": 1,
            "expert": "seer",
        }


async def test_retries_back_off_then_dead_letter(app: App) -> None:
    calls: list[float] = []

    @app.task(retries=RetryPolicy(max_attempts=3, backoff=0.05, jitter=0.0))
    async def flaky() -> None:
        calls.append(time.monotonic())
        raise RuntimeError("always")

    async with expert(app):
        h = await app.submit(flaky)
        with pytest.raises(TaskFailed, match="ended dead: RuntimeError: always"):
            await h.result(timeout=10)
    assert len(calls) == 3
    assert calls[2] - calls[1] >= 0.1 * 0.9  # 0.05 then 0.1: exponential
    task = await h.get()
    assert task.error["attempt"] == 3


async def test_an_error_that_is_not_retryable_fails_at_once(app: App) -> None:
    @app.task(retries=RetryPolicy(max_attempts=5, dont_retry_on=(ValueError,)))
    def strict(x: int) -> int:
        raise ValueError(f"bad {x}")

    async with expert(app):
        h = await app.submit(strict, [7])
        with pytest.raises(TaskFailed, match="ended failed: ValueError: bad 7"):
            await h.result(timeout=10)
    assert (await h.get()).attempts == 1


async def test_timeout_is_a_retryable_failure(app: App) -> None:
    @app.task(timeout=0.05, retries=1)
    async def sleepy() -> None:
        await asyncio.Event().wait()

    async with expert(app):
        h = await app.submit(sleepy)
        with pytest.raises(TaskFailed, match="Timeout"):
            await h.result(timeout=10)
    assert (await h.get()).attempts == 2


async def test_cancel_a_running_task_stops_it_and_commits_nothing(app: App) -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()

    @app.task
    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async with expert(app, lease_ttl=0.6):
        h = await app.submit(forever)
        await asyncio.wait_for(started.wait(), 10)
        store = await app.store()
        await store.cancel(h.id)
        t0 = time.monotonic()
        await asyncio.wait_for(stopped.wait(), 5)
        assert time.monotonic() - t0 < 0.6  # within about one heartbeat (0.2 s)
    task = await h.get(history=True) if False else await (await app.store()).get(h.id, history=True)
    assert task.state == TaskState.CANCELLED
    assert "succeeded" not in [e.event for e in task.history]


async def test_an_expert_that_cannot_renew_stops_everything_within_its_lease(app: App) -> None:
    faulty: FaultyStore | None = None

    def factory(url: str) -> Any:
        nonlocal faulty
        faulty = FaultyStore(make_store(url))
        return faulty

    app2 = App(app.store_url, store_factory=factory)
    started = asyncio.Event()
    stopped = asyncio.Event()

    @app2.task
    async def long() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async with expert(app2, lease_ttl=0.9, name="cut-off") as e:
        await app2.submit(long)
        await asyncio.wait_for(started.wait(), 10)
        assert faulty is not None
        faulty.cut("renew", "complete", "fail", "checkpoint")
        t0 = time.monotonic()
        await asyncio.wait_for(stopped.wait(), 5)
        # the lease is 0.9 s and renewals every 0.3 s: it must stop within lease + one beat
        assert time.monotonic() - t0 <= 0.9 + 0.3 + 0.1
        assert e.stats.leases_lost >= 1
        faulty.heal()
    await app2.aclose()


async def test_the_same_expert_id_cannot_be_live_twice(app: App) -> None:
    @app.task
    async def nothing() -> None:
        return None

    async with expert(app, name="twin"):
        with pytest.raises(ExpertConflict, match="'twin' is live elsewhere"):
            async with expert(app, name="twin"):
                pass


async def test_idempotency_key_returns_the_first_task(app: App) -> None:
    @app.task
    async def once() -> None:
        return None

    a = await app.submit(once, key="order-42")
    b = await app.submit(once, key="order-42")
    assert a.id == b.id and a.created and not b.created


async def test_unknown_task_type_is_refused_and_nothing_is_written(app: App) -> None:
    with pytest.raises(UnknownTaskType, match="unknown task type 'ghost'"):
        await app.submit("ghost")
    assert await (await app.store()).list_tasks() == []


async def test_dependencies_run_in_order(app: App) -> None:
    order: list[str] = []

    @app.task
    async def step(name: str) -> str:
        order.append(name)
        return name

    async with expert(app, concurrency=4):
        store = await app.store()
        first = app.build_spec(step, ["first"])
        second = app.build_spec(step, ["second"], depends_on=[first.id])
        third = app.build_spec(step, ["third"], depends_on=[first.id, second.id])
        handles = await app.submit_many([third, second, first])
        assert (await store.get(third.id)).state in (TaskState.WAITING, TaskState.SUCCEEDED)
        for h in handles:
            await h.result(timeout=10)
    assert order == ["first", "second", "third"]


async def test_requirements_route_work_to_capable_experts(app: App) -> None:
    @app.task(requirements=["gpu"])
    async def render(ctx: TaskContext) -> str:
        return ctx.expert

    @app.task
    async def plain(ctx: TaskContext) -> str:
        return ctx.expert

    async with (
        expert(app, name="cpu-only"),
        expert(app, name="gpu-box", capabilities=Capabilities(frozenset({"gpu"}))),
    ):
        gpu = [await app.submit(render) for _ in range(10)]
        assert {await h.result(timeout=10) for h in gpu} == {"gpu-box"}
        plain_runs = [await app.submit(plain) for _ in range(10)]
        for h in plain_runs:
            await h.result(timeout=10)


def test_sync_facade_submits_and_waits(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'sync.db'}")

    @app.task
    async def double(x: int) -> int:
        return 2 * x

    async def serve(stop: asyncio.Event) -> None:
        async with expert(app):
            await stop.wait()

    import threading

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    t = threading.Thread(target=loop.run_until_complete, args=(serve(stop),))
    t.start()
    try:
        with app:
            h = app.submit_sync(double, [21])
            assert h.wait(timeout=10) == 42
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(30)
        loop.close()


async def test_an_emergency_expert_joins_only_under_pressure(app: App) -> None:
    from contend.runtime.competition import PressurePolicy

    release = asyncio.Event()

    @app.task
    async def job(ctx: TaskContext) -> str:
        await release.wait()
        return ctx.expert

    calm = PressurePolicy(backlog_per_expert=3, max_wait=3600, utilisation=2.0)
    async with (
        expert(app, name="worker", concurrency=1, lease_ttl=0.9),
        expert(
            app, name="reserve", tier="emergency", concurrency=4, lease_ttl=0.9, pressure=calm
        ) as reserve,
    ):
        store = await app.store()
        first = [await app.submit(job) for _ in range(3)]  # 1 running + 2 waiting: calm

        async def worker_busy() -> bool:
            return len(await store.list_tasks(state=TaskState.RUNNING)) == 1

        await eventually(worker_busy)
        beats = reserve.stats.heartbeats
        await eventually(lambda: _beats(reserve, beats + 2))  # it weighed the calm backlog
        assert not reserve.competition.active
        assert reserve.load == 0
        flood = [await app.submit(job) for _ in range(6)]  # 8 waiting for 1 worker: pressure

        async def reserve_joined() -> bool:
            return reserve.load > 0

        await eventually(reserve_joined)
        release.set()
        owners = [await h.result(timeout=10) for h in first + flood]
        assert "reserve" in owners
        await eventually(lambda: _standing_down(reserve))


async def _beats(e: Expert, n: int) -> bool:
    return e.stats.heartbeats >= n


async def _standing_down(e: Expert) -> bool:
    return not e.competition.active


async def test_claims_the_expert_does_not_know_of_are_released(app: App) -> None:
    @app.task(queue="other")
    async def elsewhere() -> None:
        return None

    async with expert(app, name="forgetful", queues=["default"], lease_ttl=0.9) as e:
        store = await app.store()
        handle = await app.submit(elsewhere)
        assert e.session is not None
        # a claim made in this expert's name whose reply never reached it
        (lost,) = await store.claim(
            "forgetful", e.session.id, ["other"], Capabilities(), limit=1, lease_ttl=0.9
        )

        async def released() -> bool:
            task = await store.get(handle.id)
            return task.state == TaskState.PENDING and task.owner is None

        await eventually(released, timeout=5)
        task = await store.get(handle.id)
        assert task.attempts == 0 and task.fence == lost.fence


async def test_an_expert_leaves_the_task_types_its_app_lacks_to_others(tmp_path: Path) -> None:
    """A rolling deploy: new code submits a new task type while an old expert still runs.
    The old expert must not claim it (it would fail it for good as UnknownTaskType)."""
    url = f"sqlite:///{tmp_path / 'deploy.db'}"
    old, new = App(url), App(url)

    @old.task(name="resize")
    @new.task(name="resize")
    async def resize(n: int) -> int:
        return n

    @new.task(name="resize_v2")
    async def resize_v2(n: int) -> str:
        return f"v2:{n}"

    try:
        later = await new.submit("resize_v2", [1], priority=10)  # the best task in the queue
        first = await new.submit("resize", [2])
        async with expert(old, name="old", window=0):
            assert await first.result(timeout=10) == 2
            task = await later.get()
            assert (task.state, task.attempts, task.owner) == (TaskState.PENDING, 0, None)
            async with expert(new, name="new", window=0):
                assert await later.result(timeout=10) == "v2:1"
        history = (await (await new.store()).get(later.id, history=True)).history
        assert [e.expert for e in history if e.event == "claimed"] == ["new"]
    finally:
        await old.aclose()
        await new.aclose()


async def test_a_stopped_expert_leaves_its_final_counts_in_the_store(app: App) -> None:
    """status and the demo show the store's per-expert counts: they must be the final ones,
    not those of the last heartbeat (here, with a 30 s lease, there is none after the tasks)."""

    @app.task
    async def quick(n: int) -> int:
        return n

    async with expert(app, name="counted", lease_ttl=30.0):
        handles = [await app.submit(quick, [n]) for n in range(5)]
        for h in handles:
            await h.result(timeout=10)
    (rec,) = await (await app.store()).list_experts()
    assert (rec.info.id, rec.alive, rec.tasks_done) == ("counted", False, 5)
    assert rec.claims_won == 5
