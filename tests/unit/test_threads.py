"""The thread runner of sync task functions: results, errors, stops, and batched hand-back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from contend import TaskContext, current
from contend.runtime.threads import ThreadRunner


def _ctx(task_id: str = "t1") -> TaskContext:
    return TaskContext(
        task_id=task_id, type="f", queue="default", fence=1, attempt=1, max_attempts=3, expert="e"
    )


async def test_results_and_errors_come_back_to_their_futures() -> None:
    runner = ThreadRunner(asyncio.get_running_loop(), 4, "t")

    def fail() -> None:
        raise ValueError("no")

    try:
        ok = runner.run(lambda a, b=0: a + b, [2], {"b": 3}, _ctx())
        bad = runner.run(fail, [], {}, _ctx())
        assert await ok == 5
        with pytest.raises(ValueError, match="no"):
            await bad
    finally:
        runner.close()


async def test_the_function_sees_its_task_as_current() -> None:
    runner = ThreadRunner(asyncio.get_running_loop(), 2, "t")
    try:
        seen = await asyncio.gather(
            *(runner.run(lambda: current().task_id, [], {}, _ctx(f"t{n}")) for n in range(6))
        )
        assert seen == [f"t{n}" for n in range(6)]
    finally:
        runner.close()


async def test_a_burst_is_handed_back_in_fewer_wakeups_than_tasks() -> None:
    loop = asyncio.get_running_loop()
    runner = ThreadRunner(loop, 2, "t")
    calls = 0
    deliver = runner._deliver

    def counting() -> None:
        nonlocal calls
        calls += 1
        deliver()

    runner._deliver = counting  # type: ignore[method-assign]
    gate = threading.Event()
    try:
        # Both workers wait on the gate, so that the results pile up before the loop runs.
        futs = [runner.run(lambda: gate.wait(5), [], {}, _ctx()) for _ in range(200)]
        gate.set()
        assert all(await asyncio.gather(*futs))
        assert 1 <= calls < 100, calls
    finally:
        runner.close()


async def test_a_stopped_run_drops_its_result_and_unstarted_jobs_never_run() -> None:
    runner = ThreadRunner(asyncio.get_running_loop(), 1, "t")
    gate, ran = threading.Event(), []
    try:
        first = runner.run(lambda: gate.wait(5), [], {}, _ctx())
        queued = runner.run(lambda: ran.append("queued"), [], {}, _ctx())
        queued.cancel()  # stopped before its turn: never called
        first.cancel()  # stopped while running: it goes on, its result is dropped
        gate.set()
        last = runner.run(lambda: "after", [], {}, _ctx())
        assert await last == "after"
        assert ran == [] and first.cancelled()
    finally:
        runner.close()


async def test_close_cancels_queued_jobs_and_refuses_new_ones() -> None:
    runner = ThreadRunner(asyncio.get_running_loop(), 1, "t")
    gate, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return gate.wait(5)

    busy = runner.run(hold, [], {}, _ctx())
    waiting = runner.run(lambda: None, [], {}, _ctx())
    assert await asyncio.to_thread(started.wait, 5)
    runner.close()
    gate.set()
    assert waiting.cancelled()
    assert await busy is True  # what was running finishes
    with pytest.raises(RuntimeError, match="closed"):
        runner.run(lambda: None, [], {}, _ctx())
    assert all(t.daemon for t in runner._threads)


async def test_took_is_the_functions_own_time_not_its_wait_for_the_loop() -> None:
    # what claiming ahead reckons with (Executor.mean_run): the loop kept busy for 0.2 s
    # after a 0.01 s function returns must not count
    runner = ThreadRunner(asyncio.get_running_loop(), 1, "t")
    took: list[float] = []
    try:
        fut = runner.run(time.sleep, [0.01], {}, _ctx(), took)
        time.sleep(0.2)  # the loop is busy: the result waits to be handed back
        await fut
        assert len(took) == 1 and 0.01 <= took[0] < 0.15
    finally:
        runner.close()
