"""Time as the expert sees it, behind one small protocol.

Every part of the expert reads the time and waits through a :class:`Clock`, never through
``time`` or ``asyncio.sleep`` directly, so that lease, timeout and back-off logic runs the same
on :class:`SystemClock` and on :class:`contend.testing.FakeClock`, which moves only when a test
tells it to. Only yields (``asyncio.sleep(0)``) and waits on events stay with asyncio: they are
not time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

log = logging.getLogger("contend.expert")


class Timer(Protocol):
    def cancel(self) -> Any:
        """Do not call back after all (nothing happens if it already has)."""


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

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        """Call *callback* on the event loop once *seconds* of this clock have passed."""


class SystemClock:
    """The host's clocks and asyncio's timers. The hot ones are the functions themselves,
    bound per instance: an expert reads the clock several times per task."""

    def __init__(self) -> None:
        self.now = time.time
        self.monotonic = time.monotonic
        self.wait_for = asyncio.wait_for

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, seconds), callback)


async def wait_event(clock: Clock, event: asyncio.Event, timeout: float) -> bool:
    """Wait until *event* is set (True) or *timeout* seconds of *clock* have passed (False)."""
    if event.is_set():
        return True
    try:
        await clock.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


async def first_of(clock: Clock, futures: Sequence[asyncio.Future[Any]], timeout: float) -> None:
    """Return once one of *futures* is done or *timeout* seconds of *clock* have passed,
    whichever comes first, leaving the futures as they are.

    As ``clock.wait_for(asyncio.wait(futures, return_when=FIRST_COMPLETED), timeout)``, but
    with no task of its own: an idle expert waits this way at every change of the store."""
    if any(f.done() for f in futures):
        return
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def open_gate(*_: object) -> None:
        if not gate.done():
            gate.set_result(None)

    for f in futures:
        f.add_done_callback(open_gate)
    timer = clock.call_later(timeout, open_gate)
    try:
        await gate
    finally:
        timer.cancel()
        for f in futures:
            f.remove_done_callback(open_gate)


#: Calls given up on by :func:`bounded`, still finishing being cancelled. Held here so that they
#: are not garbage-collected mid-way and their errors are read; see :func:`settle_strays`.
_strays: set[asyncio.Future[Any]] = set()


def _forget(call: asyncio.Future[Any]) -> None:
    _strays.discard(call)
    if not call.cancelled() and call.exception() is not None:
        log.debug("a call given up on ended with %r", call.exception())


def give_up(call: asyncio.Future[Any]) -> None:
    """Cancel *call* and stop caring: it may take its time to finish (a database driver may
    try to cancel the query on the server first), nobody waits for it."""
    if call.done():
        _forget(call)
        return
    call.cancel()
    _strays.add(call)
    call.add_done_callback(_forget)


async def bounded(
    clock: Clock,
    aw: Awaitable[T],
    timeout: float,
    *,
    unless: set[Callable[[], None]] | None = None,
) -> T:
    """The result of *aw*, or :class:`TimeoutError` once *timeout* seconds of *clock* have
    passed (or as soon as a callback added to *unless* is called: a session's ``on_lost``),
    whatever *aw* is doing by then.

    Unlike :func:`asyncio.wait_for`, the caller does not wait for a call that overran to finish
    being cancelled: a store call stuck on a connection whose packets vanish may take many
    seconds to give up, and a deadline that waits for it is no deadline."""
    call = asyncio.ensure_future(aw)
    if call.done():
        return call.result()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def open_gate(*_: object) -> None:
        if not gate.done():
            gate.set_result(None)

    call.add_done_callback(open_gate)
    timer = clock.call_later(timeout, open_gate)
    if unless is not None:
        unless.add(open_gate)
    try:
        await gate
    except asyncio.CancelledError:
        give_up(call)
        raise
    finally:
        timer.cancel()
        call.remove_done_callback(open_gate)
        if unless is not None:
            unless.discard(open_gate)
    if call.done():
        return call.result()
    give_up(call)
    raise TimeoutError


async def settle_strays(clock: Clock, limit: float) -> int:
    """Wait up to *limit* seconds for the calls given up on in this event loop to end; returns
    how many are still running."""
    loop = asyncio.get_running_loop()
    mine = {c for c in _strays if c.get_loop() is loop}
    if mine:
        try:
            await clock.wait_for(asyncio.wait(mine), limit)
        except TimeoutError:
            pass
    return sum(1 for c in mine if not c.done())
