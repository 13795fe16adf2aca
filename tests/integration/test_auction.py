"""Auction mode: bids in the store, the top bidder claims, the next one after a grace period."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contend import App, Capabilities, TaskContext
from contend.domain.task import TaskSpec
from contend.errors import ConfigError, LeaseLost
from contend.store.port import ExpertInfo, Store
from contend.store.registry import make_store
from contend.testing import FakeClock
from tests.integration.test_runtime import expert


@pytest.fixture(params=["memory", "sqlite"])
async def store_and_clock(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Store, FakeClock]]:
    clock = FakeClock()
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'a.db'}"
    store = make_store(url, clock=clock)
    await store.open()
    yield store, clock
    await store.close()


async def test_bids_are_ranked_and_the_auction_closes_on_the_store_clock(
    store_and_clock: tuple[Store, FakeClock],
) -> None:
    store, clock = store_and_clock
    (sub,) = await store.submit([TaskSpec.build("render")])
    sessions = {n: await store.register_expert(ExpertInfo(n), 30) for n in ("a", "b", "c")}
    first = await store.bid("a", sessions["a"], sub.id, 0.5, 1.0)
    assert first.closes_at == pytest.approx(first.now + 1.0)
    clock.advance(0.2)
    await store.bid("b", sessions["b"], sub.id, 0.9, 5.0)  # a later bid does not move the close
    clock.advance(0.2)
    last = await store.bid("c", sessions["c"], sub.id, 0.9, 1.0)
    assert last.closes_at == first.closes_at
    assert [name for name, _ in last.bids] == ["b", "c", "a"]  # best, then earliest
    assert last.may_claim_at("b", 0.5) == last.closes_at
    assert last.may_claim_at("a", 0.5) == last.closes_at + 1.0
    assert last.may_claim_at("stranger", 0.5) == last.closes_at + 1.5
    again = await store.bid("a", sessions["a"], sub.id, 0.95, 1.0)  # a raised bid moves up
    assert again.bids[0] == ("a", 0.95)


async def test_a_bid_on_a_task_that_is_gone_says_so_and_bids_are_cleared(
    store_and_clock: tuple[Store, FakeClock],
) -> None:
    store, _ = store_and_clock
    (sub,) = await store.submit([TaskSpec.build("render")])
    s = await store.register_expert(ExpertInfo("a"), 30)
    await store.bid("a", s, sub.id, 0.5, 1.0)
    (claimed,) = await store.claim(
        "a", s, ["default"], Capabilities(), limit=1, lease_ttl=30, task_ids=[sub.id]
    )
    closed = await store.bid("a", s, sub.id, 0.5, 1.0)
    assert not closed.open and closed.bids == ()
    await store.expire()  # housekeeping drops the stale auction
    assert claimed.id == sub.id


async def test_bids_need_a_live_session_and_a_sane_score(
    store_and_clock: tuple[Store, FakeClock],
) -> None:
    store, clock = store_and_clock
    (sub,) = await store.submit([TaskSpec.build("render")])
    s = await store.register_expert(ExpertInfo("a"), 1)
    with pytest.raises(ConfigError, match="score in"):
        await store.bid("a", s, sub.id, 1.5, 1.0)
    clock.advance(2)
    with pytest.raises(LeaseLost):
        await store.bid("a", s, sub.id, 0.5, 1.0)


async def test_the_top_bidder_gets_heavy_tasks(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'auction.db'}")

    @app.task(mode="auction", requirements=["gpu"])
    async def train(ctx: TaskContext) -> str:
        return ctx.expert

    gpu = Capabilities(frozenset({"gpu"}))
    big = Capabilities(frozenset({"gpu", "tpu", "fpga"}))
    async with (
        expert(app, name="exact", capabilities=gpu, auction_window=0.1),
        expert(app, name="oversized", capabilities=big, auction_window=0.1),
    ):
        handles = [await app.submit(train) for _ in range(6)]
        winners = [await h.result(timeout=20) for h in handles]
    assert winners.count("exact") >= 5, winners


async def test_the_next_bidder_claims_when_the_winner_never_does(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'grace.db'}")

    @app.task(mode="auction")
    async def heavy(ctx: TaskContext) -> str:
        return ctx.expert

    store = await app.store()
    task = await app.submit(heavy)
    # a rival bids the best score and then vanishes without claiming
    ghost = await store.register_expert(ExpertInfo("ghost"), 60)
    opened = await store.bid("ghost", ghost, task.id, 1.0, 0.1)
    async with expert(app, name="spare", auction_window=0.1, auction_grace=0.3):
        assert await task.result(timeout=10) == "spare"
    done = await store.get(task.id, history=True)
    (claim,) = [e for e in done.history if e.event == "claimed"]
    # 'spare' ranks second: it may claim one grace period after the close, not before
    assert claim.at >= opened.closes_at + 0.3
