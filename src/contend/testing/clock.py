"""A clock that moves only when told to, for lease, timeout and back-off logic without waiting.

One :class:`FakeClock` can be a store's clock (it is callable: ``MemoryStore(clock=clock)``)
and an expert's :class:`~contend.runtime.clock.Clock` at once (``Expert(app, clock=clock)``):
``sleep`` and ``wait_for`` then wait on its time, and nothing happens until the test moves it.

``advance(s)`` jumps; ``await run(s)`` lets time pass as it would for real, stopping at every
sleeper's deadline on the way and letting the event loop settle there, so that what a waking
sleeper starts (a renewal, a timeout, a retry) happens at its own moment, in deadline order.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: ``settle`` gives up after this many turns of the loop (something keeps itself busy).
SETTLE_LIMIT = 10_000
#: The sleepers' heap is cleared of cancelled sleepers once it holds this many, and then each
#: time it has doubled since.
COMPACT_MIN = 1024


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.value = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0
        self._compact_at = COMPACT_MIN

    # -- reading ---------------------------------------------------------------------------
    def __call__(self) -> float:
        return self.value

    def now(self) -> float:
        return self.value

    def monotonic(self) -> float:
        return self.value

    def next_deadline(self) -> float | None:
        """When the earliest sleeper wakes, or None when nobody sleeps on this clock."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)  # cancelled sleepers
        return self._sleepers[0][0] if self._sleepers else None

    # -- waiting ---------------------------------------------------------------------------
    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        await self._timer(seconds)

    def _timer(self, seconds: float) -> asyncio.Future[None]:
        """A future done once the clock reaches now + *seconds* (> 0)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._push(self.value + seconds, future)
        return future

    def _push(self, deadline: float, future: asyncio.Future[None]) -> None:
        sleepers = self._sleepers
        if len(sleepers) >= self._compact_at:
            # A cancelled sleeper stays in the heap until its deadline comes up, and an idle
            # expert's long waits are cancelled by the change that ends them, so in a
            # simulation nearly all of it was dead weight (280,000 entries among 250 experts
            # over a 1,000-task batch), which every garbage collection walked through.
            sleepers[:] = [s for s in sleepers if not s[2].done()]
            heapq.heapify(sleepers)
            self._compact_at = max(COMPACT_MIN, 2 * len(sleepers))
        self._seq += 1
        heapq.heappush(sleepers, (deadline, self._seq, future))

    def call_later(self, seconds: float, callback: Callable[[], object]) -> asyncio.Future[None]:
        """Call *callback* once the clock reaches now + *seconds*; ``cancel()`` the returned
        future to call it off."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def fire(f: asyncio.Future[None]) -> None:
            if not f.cancelled():
                callback()

        future.add_done_callback(fire)
        if seconds <= 0:
            future.set_result(None)  # at the next turn of the loop
        else:
            self._push(self.value + seconds, future)
        return future

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        if timeout is None:
            return await aw
        task = asyncio.ensure_future(aw)
        # a future on the clock's heap, not a task sleeping on it: an idle expert waits this
        # way at every change of the store, and a task per wait was a good part of a large
        # simulation's cost
        timer: asyncio.Future[None] = (
            self._timer(timeout) if timeout > 0 else asyncio.ensure_future(self.sleep(0))
        )
        either: set[asyncio.Future[Any]] = {task, timer}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not task.done():
                task.cancel()
        if not task.done():
            await asyncio.wait({task})  # let it finish being cancelled
        if task.cancelled():
            raise TimeoutError
        return task.result()

    # -- moving ----------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Jump *seconds* ahead and wake every sleeper due by then (they run at the next turn
        of the event loop)."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.value += seconds
        self._wake()

    async def run(self, seconds: float) -> None:
        """Let *seconds* pass: stop at each sleeper's deadline on the way, wake it and let the
        loop settle, then settle at the end."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        end = self.value + seconds
        await self.settle()
        while (due := self.next_deadline()) is not None and due <= end:
            self.value = max(self.value, due)
            self._wake()
            await self.settle()
        self.value = end
        self._wake()
        await self.settle()

    async def run_until(
        self, done: Callable[[], bool], limit: float, *, step: float | None = None
    ) -> bool:
        """Let time pass until *done()* is true, at most *limit* seconds: whenever the loop has
        settled, jump to the next sleeper's deadline (at most *step* ahead, when given).
        Returns whether *done()* became true."""
        end = self.value + limit
        await self.settle()
        while not done():
            if self.value >= end:
                return False
            due = self.next_deadline()
            target = end if due is None else min(due, end)
            if step is not None:
                target = min(target, self.value + step)
            self.value = target
            self._wake()
            await self.settle()
        return True

    async def settle(self) -> None:
        """Let every task that can run do so, until all of them wait (on this clock, an event
        or real I/O). Reads the loop's ready queue where the loop has one (CPython's does)."""
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", None)
        quiet = 0
        for _ in range(SETTLE_LIMIT):
            await asyncio.sleep(0)
            if ready is None:
                quiet += 1
                if quiet >= 50:
                    return
            elif not ready:
                quiet += 1
                if quiet >= 2:
                    return
            else:
                quiet = 0

    def _wake(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self.value:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
