"""Wake-ups: learn that the store changed without taking a lock.

``PRAGMA data_version`` moves when another connection commits; an idle expert checks it every
few milliseconds. This process's own commits do not move it, so each part that commits a
change others may wait for calls :meth:`Wakeups.touch`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time


class Wakeups:
    def __init__(self, idle_poll: float) -> None:
        self._idle_poll = idle_poll
        self._data_version = -1
        self._local_change = asyncio.Event()
        self._local_gen = 0
        self._seen_gen = 0

    def touch(self) -> None:
        """Wake this process's waiters: its own commits do not move ``data_version``."""
        self._local_gen += 1
        self._local_change.set()
        self._local_change = asyncio.Event()

    async def wait_for_change(self, conn: sqlite3.Connection, timeout: float) -> None:
        """Return when another connection committed (``PRAGMA data_version`` moved, checked
        every few ms without taking a lock), this process changed something, or *timeout*
        passed."""
        deadline = time.monotonic() + timeout
        poll = min(self._idle_poll, timeout)
        while True:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version or self._local_gen != self._seen_gen:
                self._data_version = version
                self._seen_gen = self._local_gen
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._local_change.wait(), min(poll, left))
            except TimeoutError:
                pass
