"""Short sync task functions move from worker threads to the event loop, on a real SQLite
store with a real expert, and go back when a run is long or uses the sync helpers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contend import App, ConfigError, RetryPolicy, TaskContext
from contend.runtime.inline import PROMOTE_AFTER
from tests.integration.test_runtime import expert


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    app = App(f"sqlite:///{tmp_path / 'loop.db'}")
    yield app
    await app.aclose()


def _where() -> str:
    return "loop" if threading.current_thread() is threading.main_thread() else "thread"


async def _run_each(app: App, fn: Any, argss: list[list[Any]]) -> list[Any]:
    """Submit one task at a time and wait for it: the runs happen in that order."""
    out = []
    for args in argss:
        out.append(await (await app.submit(fn, args)).result(timeout=10))
    return out


async def test_a_short_function_moves_to_the_loop_after_proving_short(app: App) -> None:
    @app.task
    def quick(n: int) -> str:
        return _where()

    assert threading.current_thread() is threading.main_thread()
    async with expert(app):
        first = await _run_each(app, quick, [[n] for n in range(PROMOTE_AFTER)])
        assert first == ["thread"] * PROMOTE_AFTER
        handles = [await app.submit(quick, [n]) for n in range(40)]
        assert {await h.result(timeout=10) for h in handles} == {"loop"}


async def test_a_long_run_on_the_loop_sends_the_type_back_to_threads(app: App) -> None:
    @app.task
    def work(ms: float) -> str:
        if ms:
            time.sleep(ms / 1000)  # the task's own work, not a wait for anything
        return _where()

    async with expert(app):
        await _run_each(app, work, [[0]] * PROMOTE_AFTER)
        assert await _run_each(app, work, [[0], [20], [0], [0]]) == [
            "loop",
            "loop",  # it took 20 ms on the loop: back to threads after it
            "thread",
            "thread",
        ]


async def test_checkpoints_asked_for_on_the_loop_are_written_and_the_type_leaves_it(
    app: App,
) -> None:
    @app.task(retries=RetryPolicy(max_attempts=2, backoff=0.01, jitter=0.0))
    def step(ctx: TaskContext, save: bool) -> Any:
        if not save:
            return _where()
        if ctx.state is None:  # first attempt: save where it ran, then fail
            ctx.checkpoint_sync({"first": _where()})
            ctx.progress_sync(1, 2, "half")
            raise RuntimeError("fail after the checkpoint")
        return {**ctx.state, "second": _where()}

    async with expert(app):
        await _run_each(app, step, [[False]] * PROMOTE_AFTER)
        h = await app.submit(step, [True])
        assert await h.result(timeout=10) == {"first": "loop", "second": "thread"}
        task = await h.get()
        assert task.progress is not None and task.progress["note"] == "half"
        # a function that calls the helpers stays in threads from then on
        assert await _run_each(app, step, [[False]] * (PROMOTE_AFTER * 2)) == ["thread"] * (
            PROMOTE_AFTER * 2
        )


async def test_asyncio_run_inside_a_function_on_the_loop_works(app: App) -> None:
    async def inner() -> int:
        await asyncio.sleep(0)
        return 7

    @app.task
    def bridge(go: bool) -> Any:
        return [asyncio.run(inner()), _where()] if go else _where()

    async with expert(app):
        await _run_each(app, bridge, [[False]] * PROMOTE_AFTER)
        assert await _run_each(app, bridge, [[True], [False]]) == [[7, "loop"], "loop"]


async def test_thread_isolation_and_timeouts_keep_a_function_in_threads(app: App) -> None:
    @app.task(isolation="thread")
    def pinned(n: int) -> str:
        return _where()

    @app.task(timeout=30)
    def timed(n: int) -> str:
        return _where()

    async with expert(app):
        runs = PROMOTE_AFTER * 2
        assert await _run_each(app, pinned, [[n] for n in range(runs)]) == ["thread"] * runs
        assert await _run_each(app, timed, [[n] for n in range(runs)]) == ["thread"] * runs


def test_thread_isolation_of_an_async_function_is_refused() -> None:
    app = App("memory://")
    with pytest.raises(ConfigError, match="isolation='thread' of 'coro' is for plain functions"):

        @app.task(isolation="thread")
        async def coro() -> None: ...

    with pytest.raises(ConfigError, match="must be None, 'thread' or 'process', got 'fiber'"):

        @app.task(isolation="fiber")
        def plain() -> None: ...
