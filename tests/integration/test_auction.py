"""Auction mode: bids in the store, the top bidder claims, the next one after a grace period."""

from __future__ import annotations

import asyncio
from pathlib import Path

from contend import App, Capabilities, TaskContext
from contend.store.port import ExpertInfo
from tests.integration.test_runtime import expert


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


async def test_auto_mode_auctions_a_type_once_its_runs_are_long(tmp_path: Path) -> None:
    from contend import Expert
    from contend.runtime.claimer import auction_types

    app = App(f"sqlite:///{tmp_path / 'auto.db'}")

    @app.task(mode="auto")
    async def sometimes() -> None:
        return None

    e = Expert(app, auction_threshold=1.0)

    def auctioned() -> set[str]:
        return auction_types(app.tasks.values(), e.competition, e.config.auction_threshold)

    assert auctioned() == set()  # nothing known yet: raced
    for _ in range(3):
        e.competition.tracker.record("sometimes", True, 0.2)
    assert auctioned() == set()  # short runs: raced
    for _ in range(10):
        e.competition.tracker.record("sometimes", True, 5.0)
    assert auctioned() == {"sometimes"}  # long runs pay for an auction


async def test_prefetch_leaves_auctioned_tasks_to_the_auction(tmp_path: Path) -> None:
    # a prefetching expert used to claim auctioned tasks ahead, with no auction at all, once
    # it ran one: the less fit one took the rest
    app = App(f"sqlite:///{tmp_path / 'prefetch.db'}")

    @app.task(mode="auction", requirements=["gpu"])
    async def train(ctx: TaskContext) -> str:
        await asyncio.sleep(0.2)
        return ctx.expert

    gpu = Capabilities(frozenset({"gpu"}))
    big = Capabilities(frozenset({"gpu", "tpu", "fpga"}))
    held = []
    async with (
        expert(
            app,
            name="exact",
            capabilities=gpu,
            concurrency=1,
            auction_window=0.05,
            auction_grace=0.05,
        ),
        expert(
            app,
            name="oversized",
            concurrency=1,
            capabilities=big,
            auction_window=0.05,
            auction_grace=0.05,
            prefetch=12,
        ) as oversized,
    ):
        handles = [await app.submit(train) for _ in range(12)]
        results = asyncio.gather(*(h.result(timeout=30) for h in handles))
        while not results.done():
            held.append(len(oversized.parts.claimer.prefetched))
            await asyncio.sleep(0.01)
        winners = await results
    assert max(held) == 0, (held, winners)
    assert winners.count("exact") >= 6, winners
