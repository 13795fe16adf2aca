"""Central queues on a real SQLite file, several experts in one process: one leader assigns,
each task runs exactly once on the expert it was given to, a leader that stops hands over at
once (its session ends, so the next term starts without waiting out a lease), and a store
that does not dispatch central queues is refused before anything is written."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contend import App, ConfigError, TaskContext
from contend.domain.dispatch import ASSIGNED, term_of
from contend.domain.task import Task
from contend.runtime.expert import Expert
from contend.store.memory import MemoryStore
from contend.store.port import Promises
from tests.integration.test_runtime import expert

TTL = 2.0


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    app = App(f"sqlite:///{tmp_path / 'central.db'}")
    app.queue("c", mode="central")
    yield app
    await app.aclose()


async def wait_until(check: Callable[[], Awaitable[bool]], deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not await check():
        assert time.monotonic() < end, "condition not met before the deadline"
        await asyncio.sleep(0.02)


async def histories(app: App, ids: list[str]) -> list[Task]:
    store = await app.store()
    return [await store.get(i, history=True) for i in ids]


def options(name: str) -> dict[str, object]:
    return {"name": name, "concurrency": 2, "lease_ttl": TTL, "queues": ["c", "default"]}


async def test_every_central_task_runs_once_on_its_assignee(app: App) -> None:
    runs: Counter[str] = Counter()
    where: dict[str, str] = {}

    @app.task(queue="c", pass_context=True)
    async def job(ctx: TaskContext, n: int) -> int:
        runs[ctx.task_id] += 1
        where[ctx.task_id] = ctx.expert
        await asyncio.sleep(0.01)
        return n

    @app.task
    async def plain(n: int) -> int:
        return n

    async with AsyncExitStack() as stack:
        experts = [
            await stack.enter_async_context(expert(app, **options(f"e{i}"))) for i in range(3)
        ]
        handles = [await app.submit(job, [i]) for i in range(60)]
        others = [await app.submit(plain, [i]) for i in range(10)]
        for h in handles + others:
            await h.result(timeout=30)
        leaders = [
            e for e in experts if e.parts and e.parts.dispatcher and e.parts.dispatcher.terms
        ]
    ids = [h.id for h in handles]
    assert sorted(runs) == sorted(ids) and set(runs.values()) == {1}
    assert len(leaders) == 1  # one leader at a time; nobody died, so one term
    for task in await histories(app, ids):
        lines = [e for e in task.history if e.event == ASSIGNED]
        claims = [e for e in task.history if e.event == "claimed"]
        assert len(lines) == 1 and len(claims) == 1, task.history
        assert term_of(lines[0].detail) == 1
        assert claims[0].expert == lines[0].expert == where[task.id]  # its assignee ran it
    assert len(set(where.values())) > 1  # the leader spread them


async def test_a_leader_that_stops_hands_over_at_once(app: App) -> None:
    gate = asyncio.Event()

    @app.task(queue="c")
    async def job(n: int) -> int:
        await gate.wait()
        return n

    async with AsyncExitStack() as stack:
        experts = {
            f"e{i}": await stack.enter_async_context(expert(app, **options(f"e{i}")))
            for i in range(3)
        }
        first = [await app.submit(job, [i]) for i in range(4)]
        gone: list[Expert | None] = [None]

        def leader() -> Expert | None:
            for e in experts.values():
                d = e.parts.dispatcher if e.parts and e is not gone[0] else None
                if d is not None and d.terms:
                    return e
            return None

        async def led() -> bool:
            return leader() is not None

        await wait_until(led)
        old = leader()
        assert old is not None
        gate.set()
        for h in first:
            await h.result(timeout=30)
        gone[0] = old
        old.stop()  # deregisters: the leadership is free now, not after its lease
        stopped = time.monotonic()

        async def taken_over() -> bool:
            return leader() is not None

        await wait_until(taken_over)
        took = time.monotonic() - stopped
        new = leader()
        assert new is not None and new.parts and new.parts.dispatcher
        assert new.parts.dispatcher.terms == {"c": 2}
        later = [await app.submit(job, [i]) for i in range(6)]
        for h in later:
            await h.result(timeout=30)
    assert took < TTL  # within one lease, though the leadership itself lasts 2/3 of one
    for task in await histories(app, [h.id for h in later]):
        (line,) = [e for e in task.history if e.event == ASSIGNED]
        assert term_of(line.detail) == 2 and line.expert != old.name


class NoCentral(MemoryStore):
    promises = Promises(transactions=True, concurrency_limits=True)


async def test_a_store_without_central_dispatch_is_refused() -> None:
    store = NoCentral()
    app = App("memory://", store_factory=lambda _url: store)
    app.queue("c", mode="central")

    @app.task(queue="c")
    def job() -> None:
        return None

    with pytest.raises(ConfigError, match="central"):
        await app.submit(job)
    assert await store.list_tasks() == []
    with pytest.raises(ConfigError, match="central"):
        async with expert(app, name="e", queues=["c"]):
            pass
    assert (await store.stats()).experts == []  # refused before it registered
