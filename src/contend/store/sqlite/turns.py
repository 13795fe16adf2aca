"""Writers of one SQLite file take turns, in the order they came.

SQLite gives its write lock to whoever asks at the moment it is free. A writer that finds it
taken can only try again later (``busy_timeout`` 0 and a short random pause, in
:meth:`Database.retry`), and a process that writes again right after its own commit nearly
always gets there first. Under load the lock is free for a few microseconds between two
transactions, and a writer polling every few milliseconds waits for seconds: four experts
draining a burst on one file, two of them waited 843 and 980 ms for one claim while the two
others took 98 % of the tasks.

:class:`Turns` puts a queue in front of the write lock: an ``flock`` on a file beside the
store (``<store>-turns``), taken before ``BEGIN IMMEDIATE`` and given up after the commit.
A writer that finds it taken polls it for a moment (:data:`POLL_FOR`), then blocks in the
kernel (on a thread of its own, not the event loop) and is woken the moment it is given up.
SQLite's lock still decides what is correct; the turn only decides who asks first, so
everything that writes without a turn (a task's own transaction, another version of contend)
is merely raced as before. The same bursts with turns: every expert ran between 0.83 and 1.20
of an even share. Alternating writers cost each other their page caches: a drain of no-op
tasks by two experts on one file, which the write lock bounds, ran about a tenth slower.

A process can be stopped (SIGSTOP) between taking its turn and its ``BEGIN``: a writer waits
for a turn at most :data:`TURN_WAIT` seconds, and after one such wait writes without turns for
:data:`SKIP_AFTER` seconds, as it did before turns existed.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import random
import threading
import time

log = logging.getLogger("contend.store.sqlite")

#: How long a writer waits for its turn before it writes without one.
TURN_WAIT = 0.5
#: A writer polls for its turn for POLL_FOR seconds (pauses from POLL_FIRST doubling up to
#: POLL_MOST, randomised) before it waits in the kernel's queue.
POLL_FOR = 0.02
POLL_FIRST = 0.0002
POLL_MOST = 0.004
#: After a wait that ran out, how long every write skips the turns.
SKIP_AFTER = 2.0


class Turns:
    """The queue of one process's writers to one store file (see the module's docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path + "-turns"
        self._fd: int | None = None
        self._held = False
        self._skip_until = 0.0
        self._local = asyncio.Lock()  # one writer of this process in the queue at a time

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:  # a read-only directory: no turns, the lock alone decides
                self._skip_until = float("inf")
                return None
        return self._fd

    async def take(self) -> None:
        """Wait for this process's turn to write (or for TURN_WAIT, then go without)."""
        await self._local.acquire()
        if time.monotonic() < self._skip_until:
            return
        fd = self._open()
        if fd is None:
            return
        # A short wait is polled, as the write lock was: a thread woken from flock needs the
        # GIL back before this process can write, up to the switch interval (5 ms) while the
        # event loop runs tasks, and meanwhile the turn is held and the lock sits free. Only
        # a writer still waiting after POLL_FOR queues in the kernel.
        began = time.monotonic()
        pause = POLL_FIRST
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            except OSError as exc:  # flock refused here (a system-call filter, say)
                log.info("no turns for the writers of %s (%s): racing for the lock", self.path, exc)
                self._skip_until = float("inf")
                return
            else:
                self._held = True
                return
            if time.monotonic() - began >= POLL_FOR:
                break
            try:
                await asyncio.sleep(random.uniform(0, pause))
            except BaseException:
                self._local.release()
                raise
            pause = min(pause * 2, POLL_MOST)
        try:
            self._held = await self._wait(fd)
        except BaseException:
            self._local.release()
            raise
        if not self._held:
            self._skip_until = time.monotonic() + SKIP_AFTER

    async def _wait(self, fd: int) -> bool:
        """Block on the turn in a thread; True once it is this process's, False after
        TURN_WAIT. A wait given up hands the turn straight back whenever it comes. The thread
        is a daemon: one blocked behind a stopped process does not keep this one from exiting."""
        loop = asyncio.get_running_loop()
        got: asyncio.Future[None] = loop.create_future()
        guard = threading.Lock()
        state = {"abandoned": False, "got": False}

        def arrived() -> None:
            if not got.done():
                got.set_result(None)

        # the thread's own descriptor of the same open file (the same lock): closing the
        # store meanwhile neither pulls it from under the thread nor lends its number to
        # another file
        own = os.dup(fd)

        def block() -> None:
            try:
                fcntl.flock(own, fcntl.LOCK_EX)
                with guard:
                    if state["abandoned"]:
                        fcntl.flock(own, fcntl.LOCK_UN)
                        return
                    state["got"] = True
                loop.call_soon_threadsafe(arrived)
            except (OSError, RuntimeError):  # the loop closed: the wait ran out long ago
                pass
            finally:
                os.close(own)

        threading.Thread(target=block, name="contend-sqlite-turn", daemon=True).start()
        try:
            await asyncio.wait_for(got, TURN_WAIT)
        except BaseException as exc:
            with guard:
                state["abandoned"] = True
                mine = state["got"]
            if mine:
                fcntl.flock(fd, fcntl.LOCK_UN)
            if isinstance(exc, TimeoutError):
                return False
            raise
        return True

    def give(self) -> None:
        """Give the turn up (after the commit or rollback)."""
        if self._held and self._fd is not None:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._local.release()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
