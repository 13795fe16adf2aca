"""Wake-ups: learn that the store changed without taking a lock, and without a busy poll.

``PRAGMA data_version`` moves when another connection commits; it costs no lock, but reading it
every 5 ms cost an idle expert 3.9 % of a core. So it is read when there is a reason to:

* on Linux, an inotify watch on the store's WAL file: every commit of another process writes
  to it, which wakes the waiter at once. The write comes a moment before the commit is visible
  (the WAL index is updated after it, and after an fsync with ``synchronous=full``), so after
  a wake-up with no change yet the waiter looks again every :data:`FASTEST` for
  :data:`ACTIVE_WINDOW`, then less and less often;
* with nothing happening, the checks back off to :data:`WATCHED_CAP` apart (a safety net: the
  watch is the signal), or, without inotify (another OS, no inotify instance left), to
  :data:`POLL_CAP` apart, starting again from the fastest after every change.

This process's own commits do not move ``data_version``, so each part that commits a change
others may wait for calls :meth:`Wakeups.touch`. Several experts of one process share one store
(``App.store()``): a change that one waiter sees wakes every waiter of the moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import sqlite3
import struct
import time
from collections.abc import Callable

log = logging.getLogger("contend.store.sqlite")

#: After a sign of activity (a write to the WAL): look every FASTEST seconds for
#: ACTIVE_WINDOW seconds (the commit may be an fsync away from visible), then back off.
FASTEST = 0.001
ACTIVE_WINDOW = 0.03
#: The longest pause between two checks when nothing happens: with the WAL watched (the
#: watch wakes the waiter; this only bounds what a missed event could cost), and without.
WATCHED_CAP = 0.5
POLL_CAP = 0.05

_IN_MODIFY, _IN_MOVED_TO, _IN_CREATE = 0x002, 0x080, 0x100
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class WalWatch:
    """An inotify watch on one WAL file (and on its directory, to follow the file when it is
    created or replaced); calls *on_activity* from the event loop on every write to it."""

    def __init__(
        self, fd: int, libc: ctypes.CDLL, wal: str, on_activity: Callable[[], None]
    ) -> None:
        self._fd = fd
        self._libc = libc
        self._wal = wal
        self._name = os.path.basename(wal).encode()
        self._on_activity = on_activity
        self._loop = asyncio.get_running_loop()
        self._add(os.path.dirname(wal), _IN_CREATE | _IN_MOVED_TO)
        self._add(wal, _IN_MODIFY)  # fails quietly while the WAL does not exist yet
        self._loop.add_reader(fd, self._readable)

    @classmethod
    def start(cls, wal: str, on_activity: Callable[[], None]) -> WalWatch | None:
        """A watch on *wal*, or None where inotify is not to be had."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):
            return None  # not Linux
        if fd < 0:
            why = os.strerror(ctypes.get_errno())
            log.info("no inotify instance for the SQLite store (%s): polling it", why)
            return None
        try:
            return cls(fd, libc, wal, on_activity)
        except BaseException:
            os.close(fd)
            raise

    def _add(self, path: str, mask: int) -> None:
        self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask)

    def _readable(self) -> None:
        active = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            at = 0
            while at + _EVENT.size <= len(data):
                _, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                active = True  # a write, or a file created (the queue overflowed: anything)
                if not mask & _IN_MODIFY and name == self._name:
                    self._add(self._wal, _IN_MODIFY)  # the WAL created or moved in: watch it
        if active:
            self._on_activity()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        os.close(self._fd)


class Wakeups:
    def __init__(self, idle_poll: float, wal: str | None = None) -> None:
        self._idle_poll = idle_poll  # the check after a change (without a watch, the fastest)
        self._wal = wal
        self._watch: WalWatch | None = None
        self._watching = False  # a watch was tried (in the loop that first waited)
        self._poll = idle_poll
        self._active_until = 0.0
        self._data_version = -1
        self._local_gen = 0
        self._seen_gen = 0
        #: Changes seen, by any waiter: a waiter woken with others returns if one of them saw
        #: the change first (it had moved data_version on, so it looked like no change).
        self._changes = 0
        #: Each waiting call's future: set True when a change was seen (return), False when
        #: there is a reason to look (the WAL was written to).
        self._waiters: set[asyncio.Future[bool]] = set()

    def touch(self) -> None:
        """Wake this process's waiters: its own commits do not move ``data_version``."""
        self._local_gen += 1
        self._wake(True)

    def _wake(self, changed: bool) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(changed)
        self._waiters.clear()

    def _activity(self) -> None:
        # a commit may be a moment from visible: look closely for a while
        self._active_until = time.monotonic() + ACTIVE_WINDOW
        self._poll = FASTEST
        self._wake(False)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._watching = False

    async def wait_for_change(self, conn: sqlite3.Connection, timeout: float) -> None:
        """Return when another connection committed (``PRAGMA data_version`` moved), this
        process changed something, or *timeout* passed; see the module for when it looks."""
        if not self._watching and self._wal is not None:
            self._watching = True
            self._watch = WalWatch.start(self._wal, self._activity)
        cap = WATCHED_CAP if self._watch is not None else max(POLL_CAP, self._idle_poll)
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        changes = self._changes
        while True:
            if self._changes != changes:
                return  # another waiter saw a change since this one began
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version or self._local_gen != self._seen_gen:
                self._data_version = version
                self._seen_gen = self._local_gen
                self._poll = self._idle_poll
                self._changes += 1
                self._wake(True)  # the others waiting now would no longer see it
                return
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                return
            pause = min(self._poll, left)
            if now >= self._active_until:
                self._poll = min(self._poll * 2, cap)  # nothing yet: look less often
            waiter: asyncio.Future[bool] = loop.create_future()
            self._waiters.add(waiter)
            timer = loop.call_later(pause, _settle, waiter)
            try:
                if await waiter:
                    return
            finally:
                timer.cancel()
                self._waiters.discard(waiter)


def _settle(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
