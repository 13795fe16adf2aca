"""Experts with ``gossip`` set learn their rivals' load from each other, not from the store;
the store keeps claims, leases and fences, and is read again when gossip stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contend import App, ConfigError, Expert
from contend.store.port import Store
from tests.integration.gossip_helpers import eventually, free_udp_port
from tests.integration.test_runtime import expert as running


class Counted:
    """Counts the store's ``list_experts`` calls (what gossip saves)."""

    def __init__(self, store: Store) -> None:
        self.calls = 0
        inner = store.list_experts

        async def list_experts() -> Any:
            self.calls += 1
            return await inner()

        store.list_experts = list_experts  # type: ignore[method-assign]


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[App]:
    app = App(f"sqlite:///{tmp_path / 'gossip.db'}")
    yield app
    await app.aclose()


def view(e: Expert, rival: str) -> Any:
    return next((p for p in e.competition.peers if p.info.id == rival), None)


async def test_rivals_and_their_load_come_by_gossip(app: App) -> None:
    gate = asyncio.Event()

    @app.task
    async def hold() -> None:
        await gate.wait()

    counted = Counted(await app.store())
    port = free_udp_port()
    seed = f"127.0.0.1:{port}"
    common: dict[str, Any] = {"gossip": (seed,), "gossip_timing": "fast", "lease_ttl": 1.5}
    async with (
        running(app, name="e1", gossip_bind=seed, concurrency=2, **common) as e1,
        running(app, name="e2", concurrency=3, queues=["other"], **common) as e2,
    ):
        assert e1.parts is not None and e1.parts.gossip is not None
        await eventually(
            lambda: view(e1, "e2") and view(e2, "e1"), 10, "the two experts see each other"
        )
        rival = view(e1, "e2")
        assert (rival.info.capacity, rival.info.queues, rival.session[:7]) == (
            3,
            ("other",),
            "gossip:",
        )
        before = counted.calls
        # e1 runs a task; e2 learns its load at e1's next heartbeat, by gossip alone
        await app.submit(hold)
        await eventually(lambda: e1.load == 1, 10, "e1 runs the task")
        await eventually(lambda: (v := view(e2, "e1")) and v.load == 1, 10, "e2 sees e1's load")
        assert counted.calls == before, "rivals were read from the store"
        gate.set()
        await eventually(lambda: (v := view(e2, "e1")) and v.load == 0, 10, "the load falls back")
        assert counted.calls == before

        # gossip stops working on e1: its housekeeping reads the store again
        e1.parts.gossip.failed = RuntimeError("gone")
        # (the count goes up when the read starts; the view changes when it returns)
        await eventually(
            lambda: (v := view(e1, "e2")) is not None and v.session[:7] != "gossip:",
            10,
            "e1's view of e2 comes from the store",
        )
        assert counted.calls > before, "e1 read rivals from the store"


async def test_a_rival_that_leaves_is_gone_from_the_view_at_once(app: App) -> None:
    port = free_udp_port()
    seed = f"127.0.0.1:{port}"
    common: dict[str, Any] = {"gossip": (seed,), "gossip_timing": "fast", "lease_ttl": 1.5}
    async with running(app, name="a", gossip_bind=seed, **common) as a:
        async with running(app, name="b", **common):
            await eventually(lambda: view(a, "b"), 10, "a sees b")
        # b stopped (it left the gossip cluster): a's next heartbeat no longer lists it,
        # although b's store record may still say it is alive until its lease lapses
        await eventually(lambda: view(a, "b") is None, 5, "a forgets b")


async def test_gossip_off_loopback_without_a_key_is_refused_and_leaves_nothing(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONTEND_GOSSIP_KEY", raising=False)
    e = Expert(app, name="k", gossip=("10.0.0.5:7946",), gossip_bind="0.0.0.0:0")
    with pytest.raises(ConfigError, match="CONTEND_GOSSIP_KEY"):
        await e.run()
    store = await app.store()
    assert [r.info.id for r in await store.list_experts() if r.alive] == []


async def test_a_summary_too_large_for_gossip_is_refused_at_start(app: App) -> None:
    queues = [f"queue-with-a-long-name-{n:03d}" for n in range(40)]
    e = Expert(app, name="big", queues=queues, gossip=("127.0.0.1:7946",))
    with pytest.raises(ConfigError, match="a gossip summary holds"):
        await e.run()
