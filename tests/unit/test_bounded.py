"""Bounded calls: a deadline that does not wait for a call that is slow to give up."""

from __future__ import annotations

import asyncio

import pytest

from contend.runtime.clock import SystemClock, bounded, first_of, settle_strays
from contend.runtime.session import Session
from contend.testing import FakeClock


async def test_an_answer_in_time_is_returned() -> None:
    clock = FakeClock(0.0)

    async def answer() -> int:
        await clock.sleep(1.0)
        return 42

    call = asyncio.create_task(bounded(clock, answer(), 2.0))
    await clock.run(1.0)
    assert await call == 42
    assert clock.next_deadline() is None  # the timer was called off


async def test_the_deadline_holds_while_the_call_is_slow_to_cancel() -> None:
    clock = FakeClock(0.0)
    cancelled, let_go = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        """As a driver that, cancelled, first tries to cancel the query on the server."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await let_go.wait()
            raise

    call = asyncio.create_task(bounded(clock, stubborn(), 2.0))
    await clock.run(1.99)
    assert not call.done()
    await clock.run(0.01)
    with pytest.raises(TimeoutError):
        await call  # at once, at the deadline...
    assert cancelled.is_set()  # ...while the call is still being cancelled
    assert await settle_strays(clock, 0.0) == 1
    let_go.set()
    assert await settle_strays(clock, 1.0) == 0


async def test_a_lost_session_cuts_the_wait_short() -> None:
    clock = FakeClock(0.0)
    session = Session("s", 10.0, clock, clock.monotonic())
    call = asyncio.create_task(bounded(clock, asyncio.Event().wait(), 10.0, unless=session.on_lost))
    await clock.run(1.0)
    assert len(session.on_lost) == 1  # the call's gate, not a task waiting on the event
    session.mark_lost("test")
    await clock.settle()
    with pytest.raises(TimeoutError):
        await call
    assert clock() == 1.0 and session.on_lost == set()


async def test_an_error_of_the_call_is_raised() -> None:
    async def fails() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        await bounded(SystemClock(), fails(), 1.0)


async def test_cancelling_the_caller_gives_up_the_call() -> None:
    clock = FakeClock(0.0)
    inner = asyncio.Event()
    ended: list[str] = []

    async def call() -> None:
        try:
            await inner.wait()
        finally:
            ended.append("cancelled")

    caller = asyncio.create_task(bounded(clock, call(), 10.0))
    await clock.settle()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await clock.settle()
    assert ended == ["cancelled"]


async def test_call_later_on_both_clocks() -> None:
    fake = FakeClock(0.0)
    fired: list[float] = []
    fake.call_later(2.0, lambda: fired.append(fake()))
    off = fake.call_later(1.0, lambda: fired.append(-1.0))
    off.cancel()
    fake.call_later(0, lambda: fired.append(fake()))
    await fake.run(3.0)
    assert fired == [0.0, 2.0]
    real = SystemClock()
    done = asyncio.Event()
    real.call_later(0.0, done.set)
    await asyncio.wait_for(done.wait(), 5)


async def test_first_of_returns_when_one_is_done_and_leaves_them_be() -> None:
    clock = FakeClock(0.0)
    loop = asyncio.get_running_loop()
    a, b = loop.create_future(), loop.create_future()
    waiting = asyncio.create_task(first_of(clock, (a, b), 5.0))
    await clock.settle()
    assert not waiting.done()
    b.set_result(None)
    await clock.settle()
    assert waiting.done() and not a.done()
    assert clock.next_deadline() is None  # its timer was called off
    a.set_result(None)  # no callback of its is left to run
    await clock.settle()


async def test_first_of_times_out_on_the_clock() -> None:
    clock = FakeClock(0.0)
    never = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(first_of(clock, (never,), 2.0))
    await clock.run(1.9)
    assert not waiting.done()
    await clock.run(0.1)
    assert waiting.done() and not never.done()
    await first_of(clock, (waiting,), 1.0)  # one already done: at once
