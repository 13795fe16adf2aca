"""Time as the expert sees it, behind one small protocol.

Every part of the expert reads the time and waits through a :class:`Clock`, never through
``time`` or ``asyncio.sleep`` directly, so that lease, timeout and back-off logic runs the same
on :class:`SystemClock` and on :class:`contend.testing.FakeClock`, which moves only when a test
tells it to. Only yields (``asyncio.sleep(0)``) and waits on events stay with asyncio: they are
not time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch, for reports only: leases are the store's time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences of it mean anything."""

    async def sleep(self, seconds: float) -> None:
        """Wait *seconds* on this clock."""

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        """As :func:`asyncio.wait_for`: the result of *aw*, or :class:`TimeoutError` (and *aw*
        cancelled) once *timeout* seconds of this clock have passed; None waits for ever."""


class SystemClock:
    """The host's clocks and asyncio's timers."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        return await asyncio.wait_for(aw, timeout)


async def wait_event(clock: Clock, event: asyncio.Event, timeout: float) -> bool:
    """Wait until *event* is set (True) or *timeout* seconds of *clock* have passed (False)."""
    if event.is_set():
        return True
    try:
        await clock.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True
