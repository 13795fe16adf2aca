"""Concurrency limits on a real SQLite file, with four experts racing: never more than the
limit of one key run at once, per key, and the other work is not held back."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from contend import App
from contend.errors import ConfigError, TaskError
from tests.integration.test_runtime import expert


async def test_four_experts_never_run_more_of_a_key_than_its_limit(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'limits.db'}")
    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    @app.task(concurrency_limit=2, limit_key="tenant:{tenant}")
    async def report(tenant: str, n: int) -> int:
        running[tenant] = running.get(tenant, 0) + 1
        peak[tenant] = max(peak.get(tenant, 0), running[tenant])
        await asyncio.sleep(0.01)
        running[tenant] -= 1
        return n

    @app.task
    async def free(n: int) -> int:
        return n

    handles = [await app.submit(report, ["a", n]) for n in range(24)]
    handles += [await app.submit(report, ["b", n]) for n in range(12)]
    handles += [await app.submit(free, [n]) for n in range(30)]
    async with AsyncExitStack() as stack:
        for n in range(4):
            await stack.enter_async_context(expert(app, name=f"e{n}", concurrency=4))
        for h in handles:
            await h.result(timeout=60)
    assert peak == {"a": 2, "b": 2}, peak
    await app.aclose()


def test_limits_are_checked_where_they_are_declared(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'bad.db'}")
    with pytest.raises(TaskError, match="concurrency limit"):

        @app.task(concurrency_limit=0)
        async def none_at_all() -> None: ...

    @app.task(concurrency_limit=2, limit_key="tenant:{tenant}")
    async def per_tenant(tenant: str) -> None: ...

    @app.task
    async def unlimited() -> None: ...

    with pytest.raises(TaskError, match="cannot be made from the task's arguments"):
        app.build_spec(per_tenant, kwargs={"other": 1})
    with pytest.raises(TaskError, match="no concurrency_limit"):
        app.build_spec(unlimited, limit_key="x")
    assert app.build_spec(per_tenant, ["acme"]).limit_key == "tenant:acme"


async def test_a_store_that_does_not_keep_limits_refuses_them() -> None:
    app = App("memory://")

    @app.task(concurrency_limit=1)
    async def one_at_a_time() -> None: ...

    # the memory store keeps them; the refusal path is the contract suite's, on the others
    assert (await app.store()).promises.concurrency_limits
    with pytest.raises(ConfigError):
        from contend.store._common import refuse_limits

        refuse_limits([app.build_spec(one_at_a_time)], "test")
    await app.aclose()
