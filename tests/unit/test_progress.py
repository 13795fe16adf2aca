"""ctx.progress(): saved under the run's fence, seen by a waiting caller, refused once the run
no longer owns its task, and checked for shape."""

from __future__ import annotations

import asyncio

import pytest

from contend import Expert, FencedOut, TaskContext, TaskError
from contend.runtime.context import TaskContext as Ctx
from contend.testing import FakeClock
from tests.unit.fakes import app_on, faulty_memory, running


async def test_a_waiting_caller_sees_each_step_and_the_store_keeps_the_last() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)

    @app.task
    async def steps(ctx: TaskContext, n: int) -> int:
        for i in range(1, n + 1):
            await clock.sleep(1.0)
            await ctx.progress(i, n, f"step {i}")
        return n

    @app.task
    def sync_steps(ctx: TaskContext) -> str:
        ctx.progress_sync(0.5, None, "half")
        return "ok"

    expert = Expert(app, name="p", lease_ttl=30.0, clock=clock)
    seen: list[object] = []
    async with running(expert, clock):
        handle = await app.submit(steps, [3])
        waiter = asyncio.create_task(handle.result(on_progress=seen.append))
        for _ in range(4):
            await clock.run(1.0)
            await asyncio.sleep(0.01)  # the waiter reads the store between steps
        assert await clock.run_until(waiter.done, limit=30)
        assert waiter.result() == 3
        other = await app.submit(sync_steps)
        # A sync function runs in a thread, in real time: wait for it in real time (the fake
        # clock would jump past it), and let the fake clock be.
        assert await asyncio.wait_for(other.result(), timeout=30) == "ok"
    assert seen[-1] == {"done": 3, "total": 3, "note": "step 3"}
    assert len(seen) >= 2  # the caller saw the steps as they came, not only the last
    assert await handle.progress() == {"done": 3, "total": 3, "note": "step 3"}
    assert (await store.get(handle.id)).checkpoint is None  # progress is not state
    assert await other.progress() == {"done": 0.5, "total": None, "note": "half"}


@pytest.mark.parametrize(
    ("done", "total", "note"),
    [(-1, None, None), (float("nan"), None, None), (True, None, None), (1, "ten", None), (1, 2, 3)],
)
async def test_progress_out_of_shape_is_refused_before_any_write(
    done: object, total: object, note: object
) -> None:
    ctx = Ctx("t", "k", "q", 1, 1, 3, "e")
    with pytest.raises(TaskError, match="progress"):
        await ctx.progress(done, total, note)  # type: ignore[arg-type]


async def test_progress_of_a_run_that_lost_its_task_is_fenced_out() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    refused: list[BaseException] = []

    @app.task
    async def late(ctx: TaskContext) -> None:
        await store.cancel(ctx.task_id)  # someone cancels it meanwhile
        try:
            await ctx.progress(1, 2)
        except FencedOut as exc:
            refused.append(exc)

    expert = Expert(app, name="f", lease_ttl=30.0, clock=clock)
    async with running(expert, clock):
        h = await app.submit(late)
        assert await clock.run_until(lambda: bool(refused), limit=30)
    assert (await store.get(h.id)).progress is None
