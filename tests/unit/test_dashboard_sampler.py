"""The dashboard's sampler spends at most a tenth of its time reading the store's stats: a
read that takes long (stats() counts every task, 0.1 s on PostgreSQL behind 200,000 tasks)
spaces the samples out, and the pages reuse a sample for as long."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from contend.dashboard.sampler import COST_SHARE, Sampler
from contend.store.memory import MemoryStore
from contend.store.port import StoreStats
from contend.testing import FakeClock


class SlowStats(MemoryStore):
    """A memory store whose stats() takes *cost* seconds of the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__("memory://")
        self.fake = clock
        self.cost = 0.0
        self.reads = 0

    async def stats(self) -> StoreStats:
        self.reads += 1
        self.fake.advance(self.cost)
        return await super().stats()


@pytest.fixture
async def store() -> AsyncIterator[SlowStats]:
    s = SlowStats(FakeClock())
    await s.open()
    yield s
    await s.close()


async def test_a_slow_read_spaces_the_samples_out(store: SlowStats) -> None:
    sampler = Sampler(store, every=1.0, clock=store.fake.monotonic)
    await sampler.take()
    assert sampler.period == 1.0  # a quick read: one a second
    store.cost = 0.5
    await sampler.take()
    assert sampler.period == pytest.approx(0.5 / COST_SHARE)  # 5 s: a tenth of the time
    store.cost = 0.01
    await sampler.take()
    assert sampler.period == 1.0  # and back when reads are quick again


async def test_a_page_reuses_a_sample_for_one_and_a_half_periods(store: SlowStats) -> None:
    sampler = Sampler(store, every=1.0, clock=store.fake.monotonic)
    store.cost = 0.5
    await sampler.take()
    store.cost = 0.0
    store.fake.advance(6.0)  # past 1.5 s, within 1.5 periods of 5 s
    assert sampler.fresh() is sampler.last is not None
    store.fake.advance(2.0)
    assert sampler.fresh() is None
    assert store.reads == 1
