"""Checkpoints in a thread of their own, not inside a commit on the event loop.

In WAL mode, the connection whose commit takes the WAL past ``wal_autocheckpoint`` pages (1,000
by default) copies the WAL back into the database file then and there, inside ``COMMIT``, and
with ``synchronous=normal`` it fsyncs the WAL and the file first and last. Measured on this
project's machine: 74 ms of wall time (8 ms of it CPU) for a WAL of 3,000 pages. In an expert
that ``COMMIT`` runs on the event loop, so every task of the process waited out the disk: in an
in-process drain the checkpoints were 60 % of the time spent in ``COMMIT`` (281 µs a commit
without them, 657 µs with them).

So a store that writes hands its checkpoints to a :class:`Checkpointer`: a daemon thread with a
connection of its own, which runs a ``PASSIVE`` checkpoint (it blocks neither readers nor
writers; one that finds another process checkpointing gives way) after a commit pokes it, at
most every :data:`INTERVAL`. Its disk waits are no longer the loop's: the ``sqlite3`` module lets
go of the GIL while SQLite works. The store's own connections keep the automatic checkpoint
only as a bound, at :data:`FALLBACK_PAGES`, for when the thread falls behind, and drop it while
a reader holds the WAL back (:meth:`Checkpointer.fit`), so that the copy after the hold is the
thread's too.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable

log = logging.getLogger("contend.store.sqlite")

#: The least time between two checkpoints of one process, seconds: often enough to keep the
#: WAL to a few thousand pages at full speed, seldom enough that the pages a burst writes many
#: times over are copied once.
INTERVAL = 0.1
#: The automatic checkpoint of the store's own connections: only when the WAL reaches this many
#: pages (16 MiB at 4 KiB a page), which the thread keeps it well below.
FALLBACK_PAGES = 4000
#: The store's connections cut the WAL file back to this size when they start it over after a
#: checkpoint (``journal_size_limit``). The WAL reuses its file from the start and does not
#: shrink on its own: once a reader had held it back, it kept the gigabytes it grew to.
WAL_KEEP_BYTES = 64 * 2**20


class Writer(sqlite3.Connection):
    """A connection of the store that writes: it remembers its automatic checkpoint bound, so
    that :meth:`Checkpointer.fit` sets the pragma only when the bound changes."""

    autocheckpoint = FALLBACK_PAGES


def writer(path: str, sync: str | None = None) -> Writer:
    """A new :class:`Writer` on the file at *path*, set up as every writing connection of the
    store is: no busy wait of SQLite's own (``Database.retry`` waits), the fallback bound, and a
    WAL cut back to ``WAL_KEEP_BYTES`` when it starts over."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, factory=Writer)
    conn.execute("PRAGMA busy_timeout = 0")
    if sync is not None:
        conn.execute(f"PRAGMA synchronous = {sync}")
    conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}")
    return conn


class Checkpointer:
    """Checkpoints the WAL of the file at *path* on a daemon thread, after :meth:`poke`.
    *guard* raises when the path no longer names the store's file (deleted, replaced,
    truncated: ``Database.check_file``): then nothing more is checkpointed, so the old WAL's
    pages are never written into what is at the path now."""

    def __init__(self, path: str, sync: str, guard: Callable[[], None] | None = None) -> None:
        self._path = path
        self._sync = sync
        self._guard = guard
        self._wanted = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: checkpoints run, and the last one's (WAL frames, frames copied back to the file)
        self.runs = 0
        self.last: tuple[int, int] | None = None
        #: the last checkpoint left at least FALLBACK_PAGES frames it could not copy: a read
        #: transaction that began before them (an open ``BEGIN``, a backup, a long report)
        #: holds the WAL back, and it grows until that transaction ends
        self.pinned = False
        self._pinned_since = 0.0

    def poke(self) -> None:
        """A commit of this process added to the WAL: checkpoint it soon."""
        if self._thread is None:
            with self._lock:
                if self._closed:
                    return
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._work, name="contend-sqlite-checkpoint", daemon=True
                    )
                    self._thread.start()
        self._wanted.set()

    def fit(self, conn: Writer) -> None:
        """Give *conn* the automatic checkpoint it should have now: FALLBACK_PAGES, or none
        while a reader holds the WAL back. Over the bound, every commit tries a checkpoint;
        while the WAL is held none can copy a page, and the first commit after the reader lets
        go would copy all of it (6 GiB after five minutes at 1,000 tasks/s), inside ``COMMIT``
        on its event loop. With no bound then, that copy is this thread's."""
        want = 0 if self.pinned else FALLBACK_PAGES
        if conn.autocheckpoint != want:
            conn.execute(f"PRAGMA wal_autocheckpoint = {want}")
            conn.autocheckpoint = want

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after the checkpoint it may be running (at most *timeout* s)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wanted.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _work(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wanted.wait()
                if self._closed:
                    return
                self._wanted.clear()
                began = time.monotonic()
                if conn is None:
                    conn = self._connect()
                if conn is not None:
                    self._checkpoint(conn)
                if self._closed:
                    return
                rest = INTERVAL - (time.monotonic() - began)
                if rest > 0 and not self._closed:
                    time.sleep(rest)  # commits meanwhile set _wanted again
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> sqlite3.Connection | None:
        try:
            # mode=rw: never create the file (a store whose file was deleted stays without one)
            uri = f"file:{urllib.parse.quote(self._path)}?mode=rw"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute(f"PRAGMA synchronous = {self._sync}")
        except sqlite3.Error as exc:
            log.warning("SQLite store %r: no connection to checkpoint with (%s)", self._path, exc)
            return None
        return conn

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        if self._guard is not None:
            try:
                self._guard()
            except Exception as exc:  # the store's file is lost: the store stops on its own
                log.debug("SQLite store %r: no more checkpoints (%s)", self._path, exc)
                self._closed = True
                return
        try:
            row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            # busy (another process checkpoints), or the file is gone: the next poke tries
            # again, and the automatic checkpoint bounds the WAL meanwhile
            log.debug("SQLite store %r: checkpoint skipped (%s)", self._path, exc)
            return
        self.runs += 1
        if row is None or int(row[0]) or int(row[1]) < 0:
            # (1, -1, -1): another connection was checkpointing. That says nothing of a
            # reader: taken for "not held back", it said so again on the next one (several
            # processes on a held file logged the warning five times a second)
            return
        self.last = (frames, copied) = (int(row[1]), int(row[2]))
        self._note_pinned(frames - copied >= FALLBACK_PAGES, frames)

    def _note_pinned(self, pinned: bool, frames: int) -> None:
        """Say when a reader starts and stops holding the WAL back: the file grows by every
        write meanwhile (gigabytes in minutes under load), which nothing else would explain."""
        if pinned and not self.pinned:
            self._pinned_since = time.monotonic()
            log.warning(
                "SQLite store %r: a read transaction is holding the WAL back (%d pages that "
                "cannot be copied to the database); %s-wal grows until that transaction ends",
                self._path,
                frames,
                self._path,
            )
        elif self.pinned and not pinned:
            log.info(
                "SQLite store %r: the WAL is no longer held back (it was for %.0f s)",
                self._path,
                time.monotonic() - self._pinned_since,
            )
        self.pinned = pinned
