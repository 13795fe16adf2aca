"""The fake clock drives asyncio waits deterministically: nothing moves until the test says so."""

from __future__ import annotations

import asyncio

import pytest

from contend.runtime.clock import Clock, SystemClock, wait_event
from contend.testing import FakeClock


async def test_sleepers_wake_at_their_deadlines_in_order() -> None:
    clock = FakeClock(100.0)
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.create_task(nap(n, s)) for n, s in (("b", 2.0), ("a", 1.0), ("c", 3.0))]
    await clock.settle()
    assert woke == [] and clock.next_deadline() == 101.0
    await clock.run(1.5)
    assert woke == [("a", 101.0)]
    await clock.run(10)
    assert woke == [("a", 101.0), ("b", 102.0), ("c", 103.0)]
    assert clock() == clock.now() == 111.5
    await asyncio.gather(*tasks)


async def test_a_jump_wakes_everyone_due_at_once() -> None:
    clock = FakeClock(0.0)
    woke: list[float] = []

    async def nap(seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(clock.monotonic())

    tasks = [asyncio.create_task(nap(s)) for s in (1.0, 2.0, 5.0)]
    await clock.settle()
    clock.advance(3)
    await clock.settle()
    assert woke == [3.0, 3.0]  # jumped: both see the time after the jump
    await clock.run(2)
    assert woke == [3.0, 3.0, 5.0]
    await asyncio.gather(*tasks)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1)


async def test_wait_for_times_out_on_the_clock_and_cancels_the_awaitable() -> None:
    clock = FakeClock(0.0)
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    waiter = asyncio.create_task(clock.wait_for(forever(), 5.0))
    await clock.run(4.999)
    assert not waiter.done()
    await clock.run(0.001)
    assert waiter.done() and isinstance(waiter.exception(), TimeoutError)
    assert cancelled.is_set()


async def test_wait_for_returns_the_result_and_stops_its_timer() -> None:
    clock = FakeClock(0.0)

    async def soon() -> str:
        await clock.sleep(1.0)
        return "done"

    waiter = asyncio.create_task(clock.wait_for(soon(), 5.0))
    await clock.run(1.0)
    assert waiter.result() == "done"
    assert clock.next_deadline() is None  # the 5 s timer is gone
    assert await clock.wait_for(asyncio.sleep(0, "now"), None) == "now"


async def test_cancelling_a_sleeper_forgets_it() -> None:
    clock = FakeClock(0.0)
    task = asyncio.create_task(clock.sleep(10))
    await clock.settle()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.next_deadline() is None


async def test_run_until_jumps_from_deadline_to_deadline() -> None:
    clock = FakeClock(0.0)
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            await clock.sleep(0.5)
            ticks.append(clock.monotonic())

    task = asyncio.create_task(ticker())
    assert await clock.run_until(lambda: len(ticks) == 4, limit=60)
    assert ticks == [0.5, 1.0, 1.5, 2.0] and clock() == 2.0
    assert not await clock.run_until(lambda: False, limit=3)
    assert clock() == 5.0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_wait_event_on_either_clock() -> None:
    clocks: list[Clock] = [FakeClock(0.0), SystemClock()]
    for clock in clocks:
        event = asyncio.Event()
        event.set()
        assert await wait_event(clock, event, 1.0)
    fake = FakeClock(0.0)
    pending = asyncio.create_task(wait_event(fake, asyncio.Event(), 2.0))
    await fake.run(2.0)
    assert pending.result() is False


async def test_cancelled_sleepers_do_not_pile_up() -> None:
    clock = FakeClock(0.0)
    woke: list[int] = []

    async def nap(n: int, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(n)

    keep = [asyncio.create_task(nap(n, 10.0 + n)) for n in range(3)]
    for _ in range(20):  # idle waits, each ended by something else
        waits = [asyncio.create_task(clock.sleep(3600.0)) for _ in range(1000)]
        await clock.settle()
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    assert len(clock._sleepers) <= 4 * 1000
    await clock.run(20.0)
    assert woke == [0, 1, 2]
    await asyncio.gather(*keep)
