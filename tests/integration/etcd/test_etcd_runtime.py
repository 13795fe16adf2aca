"""The real expert runtime on the etcd store: several experts, each with its own connection."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from contend import App, Expert
from contend.domain.task import TaskState
from contend.store.etcd import EtcdStore
from contend.store.etcd.rpc import Etcd

pytestmark = pytest.mark.etcd


def make_app(url: str, ran: Counter[str]) -> App:
    app = App(url)

    @app.task
    async def square(x: int) -> int:
        ran[f"x{x}"] += 1
        await asyncio.sleep(0.01)  # a little work, so that experts overlap
        return x * x

    @app.task(mode="auction")
    async def heavy(x: int) -> int:
        ran[f"h{x}"] += 1
        return -x

    return app


@pytest.fixture(params=["as-the-server-allows", "read-transactions"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of reading several keys: the tests' etcd (3.5.1) gets plain ranges, because
    its read-only transactions can crash it (test_cancelled_reads.py); a sound server gets
    one transaction, which this forces."""
    if request.param == "read-transactions":
        check = Etcd.check_server

        async def forced(self: Etcd) -> None:
            await check(self)
            self.read_txns = True

        monkeypatch.setattr(Etcd, "check_server", forced)
    return str(request.param)


async def test_experts_share_the_work_and_commit_once(store_url: str, read_path: str) -> None:
    ran: Counter[str] = Counter()
    apps = [make_app(store_url, ran) for _ in range(3)]
    experts = [
        Expert(app, name=f"x{n}", concurrency=4, lease_ttl=3.0) for n, app in enumerate(apps)
    ]
    runs = [asyncio.create_task(e.run()) for e in experts]
    try:
        client = make_app(store_url, ran)
        handles = [await client.submit("square", [i]) for i in range(40)]
        auctioned = [await client.submit("heavy", [i]) for i in range(6)]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
        assert results == [i * i for i in range(40)]
        sold = await asyncio.wait_for(asyncio.gather(*(h.result() for h in auctioned)), 60)
        assert sold == [-i for i in range(6)]
        store = await client.store()
        assert isinstance(store, EtcdStore)
        tasks = await store.list_tasks(limit=100)
        assert {t.state for t in tasks} == {TaskState.SUCCEEDED}
        assert all(t.fence == 1 for t in tasks)
        assert sum(e.stats.tasks_done for e in experts) == 46
        await client.aclose()
    finally:
        for e in experts:
            e.stop()
        await asyncio.wait_for(asyncio.gather(*runs), 30)
        for app in apps:
            await app.aclose()
    assert all(n == 1 for n in ran.values())
