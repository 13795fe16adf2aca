"""What a store's ``wait_for_change`` and ``wait_for_work`` wait on, where this process hears
of every change itself (the memory store's writes, PostgreSQL's notifications)."""

from __future__ import annotations

import asyncio
import math


class Changes:
    """Two counters, each with an event its waiters wait on: every change, and the changes
    that may have made a task claimable (work). A wait returns at once when its counter moved
    since the last wait of the same kind returned, so that a change made while nobody waited
    is not missed."""

    __slots__ = ("_changed", "_seen", "_version", "_work_changed", "_work_seen", "_work_version")

    def __init__(self) -> None:
        self._changed = asyncio.Event()
        self._version = self._seen = 0
        self._work_changed = asyncio.Event()
        self._work_version = self._work_seen = 0

    @property
    def work_version(self) -> int:
        """How many changes of work there have been."""
        return self._work_version

    def touch(self, work: bool = True) -> None:
        """Wake the waiters for a change; those for work too when *work*."""
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        if work:
            self._work_version += 1
            self._work_changed.set()
            self._work_changed = asyncio.Event()

    async def wait(self, timeout: float, *, work: bool = False) -> None:
        """Until the next change (of work, when *work*) or *timeout* seconds (``math.inf``:
        none, and no timer)."""
        if work:
            if self._work_version == self._work_seen:
                await _wait(self._work_changed, timeout)
            self._work_seen = self._work_version
        else:
            if self._version == self._seen:
                await _wait(self._changed, timeout)
            self._seen = self._version


async def _wait(changed: asyncio.Event, timeout: float) -> None:
    if timeout <= 0:
        return
    try:
        await asyncio.wait_for(changed.wait(), None if timeout == math.inf else timeout)
    except TimeoutError:
        pass
