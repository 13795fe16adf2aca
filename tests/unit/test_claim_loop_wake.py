"""The claim loop never sleeps on a stale view of its slots.

It read its free slots before a round of claims and, when that round brought nothing while the
slots had been full, waited for a slot to free, for up to ``idle_wait``. A run that ended while
the round was out had already rung that bell, and the wait cleared it: the expert sat idle for
a second with free slots while new tasks waited. Sync bodies on PostgreSQL at 1,000 tasks/s
showed it as a pickup p50 of 505 ms and p99 of 986 ms (docs/benchmarks.md, sustained load)."""

from __future__ import annotations

import asyncio

from contend import Expert
from contend.testing import FakeClock
from tests.unit.fakes import app_on, faulty_memory, running


async def test_a_slot_freed_during_a_round_is_used_at_once() -> None:
    clock = FakeClock(1_000.0)
    store = faulty_memory(clock)
    app = app_on(store)
    release = asyncio.Event()
    started: dict[str, float] = {}

    @app.task
    async def hold(name: str) -> None:
        started[name] = clock()
        if name == "a":
            await release.wait()

    # one slot; a prefetch of one gives the loop a round to make while the slot is full
    expert = Expert(app, name="x", concurrency=1, prefetch=1, lease_ttl=30.0, clock=clock)
    async with running(expert, clock):
        await app.submit(hold, ["a"])
        assert await clock.run_until(lambda: "a" in started, limit=5)
        await clock.run(0.1)  # the loop waits for a slot now (its prefetch claim got nothing)
        store.hang("claim")
        await clock.run(expert.config.idle_wait)  # it looks again: that claim hangs
        assert store.hanging == 1
        release.set()  # a's run ends while the round is out
        await clock.settle()
        assert expert.parts is not None and expert.parts.executor.load == 0
        store.heal()  # the round comes back empty
        await clock.settle()
        submitted = clock()
        await app.submit(hold, ["b"])
        assert await clock.run_until(lambda: "b" in started, limit=5)
        assert started["b"] - submitted < 0.1, started["b"] - submitted
