"""Helpers for running the expert's parts on a memory store and a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from contend import App, Expert
from contend.runtime.hooks import MOMENTS, Hook
from contend.store.memory import MemoryStore
from contend.testing import FakeClock
from contend.testing.faults import FaultyStore


class Recorder(Hook):
    """Records every moment with its arguments and the clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[tuple[float, str, tuple[Any, ...]]] = []

    def of(self, moment: str) -> list[tuple[Any, ...]]:
        return [args for _, name, args in self.calls if name == moment]

    def times(self, moment: str) -> list[float]:
        return [at for at, name, _ in self.calls if name == moment]


def _record(moment: str) -> Any:
    def method(self: Recorder, *args: Any) -> None:
        self.calls.append((self.clock(), moment, args))

    return method


for _moment in MOMENTS:
    setattr(Recorder, _moment, _record(_moment))


def faulty_memory(clock: FakeClock) -> FaultyStore:
    return FaultyStore(MemoryStore("memory://", clock=clock))


def app_on(store: Any) -> App:
    """An app whose store (for every event loop) is *store*."""
    return App("memory://", store_factory=lambda url: store)


@asynccontextmanager
async def running(expert: Expert, clock: FakeClock) -> AsyncIterator[Expert]:
    """Run *expert* on *clock*; stop it and wait for it (on the clock) on the way out."""
    runner = asyncio.create_task(expert.run())
    await clock.settle()
    if runner.done():
        runner.result()  # raises what run() raised
    assert expert.started.is_set()
    try:
        yield expert
    finally:
        expert.stop()
        await clock.run_until(runner.done, limit=600)
        await runner
