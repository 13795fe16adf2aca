"""One connection to the store's file and its write discipline.

Every write is one ``BEGIN IMMEDIATE`` transaction (:meth:`Database.tx`). ``busy_timeout`` is 0,
so a busy database raises at once and :meth:`Database.retry` tries again after a short random
pause, which shares the lock fairly between processes (SQLite's own busy handler lets one
process win nearly every time).

A connection goes on writing into the file it opened, even once that file was deleted or
replaced at its path (a ghost nobody else will see again), so every write first checks that the
path still names that file (:meth:`Database.check_file`): a store that lost its file, or its
tables, raises :class:`~contend.errors.SchemaError` and nothing is written.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from contend.domain.task import Capabilities, Requirements
from contend.errors import ConfigError, SchemaError, StoreBusy, StoreError
from contend.store._cancel import cancels, check_wanted
from contend.store.sqlite.checkpoints import Checkpointer, Writer, writer
from contend.store.sqlite.turns import Turns
from contend.store.sqlite.wakeups import Wakeups

T = TypeVar("T")

#: Busy retries: pauses up to BUSY_PAUSE for the first BUSY_SHORT seconds, then up to
#: BUSY_PAUSE_LONG (an expert waiting out a lock held for seconds cost 4 % of a core).
BUSY_PAUSE = 0.004
BUSY_SHORT = 0.1
BUSY_PAUSE_LONG = 0.1


class Database:
    """What every part of the store shares: the connection, the clock, the capabilities that
    the ``contend_fits`` SQL function checks requirements against, and the wake-ups."""

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], float],
        busy_deadline: float,
        idle_poll: float,
        sync: str = "NORMAL",
    ) -> None:
        self.path = path
        self.clock = clock
        self.busy_deadline = busy_deadline
        self.caps = Capabilities()
        self.fair_cursor: dict[str, str] = {}  # queue -> the fair key a fair claim ended at
        self._where = os.path.abspath(path)  # the same file if the process changes directory
        self.wakeups = Wakeups(idle_poll, f"{self._where}-wal")
        #: checkpoints off the event loop, for every connection of this store that writes
        self.checkpointer = Checkpointer(self._where, sync, guard=self.check_file)
        #: writers of the file take turns for its write lock (turns.py)
        self.turns = Turns(self._where)
        self._db: Writer | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file opened
        self.trim_cursor = 0  # retention: the last history rowid checked against the cap
        self.trim_next = 0.0  # retention: when (time.monotonic()) histories are next checked

    async def open(
        self, prepare: Callable[[sqlite3.Connection], None], *, create: bool = True
    ) -> None:
        """Connect, then run *prepare* (create or check the schema) while busy-retrying. Unless
        *create*, a file that does not exist is not made (SchemaError)."""
        if self._db is not None:
            return
        directory = os.path.dirname(self._where)
        if not os.path.isdir(directory):
            raise ConfigError(
                f"directory {directory!r} of SQLite store {self.path!r} does not exist"
            )
        if not create and not os.path.exists(self._where):
            raise SchemaError(not_yet(self.path, "does not exist"))
        try:
            db = writer(self.path)  # checkpoints.py
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self.path!r}: {exc}") from exc
        db.create_function("contend_fits", 1, self._fits, deterministic=True)
        self._db = db
        try:
            await self.retry(lambda: prepare(db))
            st = os.stat(self._where)
            self._file = (st.st_dev, st.st_ino)
        except BaseException:
            db.close()
            self._db = None
            raise

    async def close(self) -> None:
        self.wakeups.close()
        self.turns.close()
        await asyncio.to_thread(self.checkpointer.close)
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def conn(self) -> Writer:
        if self._db is None:
            raise StoreError("the SQLite store is not open (call await store.open())")
        return self._db

    def _fits(self, req_json: str) -> int:
        return int(self.caps.satisfies(Requirements.from_json(json.loads(req_json))))

    # -- the write discipline --------------------------------------------------------------
    async def retry(self, fn: Callable[[], T], *, turns: Turns | None = None) -> T:
        """Run *fn*, retrying after a short random pause while the database is busy; not
        once its caller gave up on it (cancelled it), whatever swallowed the cancellation.
        With *turns*, each try waits for this process's turn to write (turns.py)."""
        began = time.monotonic()
        deadline = began + self.busy_deadline
        pause = 0.0002
        since = cancels()
        while True:
            check_wanted(since)
            if turns is not None:
                await turns.take()
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    raise SchemaError(
                        f"the SQLite store {self.path!r} lost its contend tables ({exc})"
                    ) from exc
                if not is_busy(exc):
                    raise StoreError(f"SQLite error on {self.path!r}: {exc}") from exc
                if time.monotonic() > deadline:
                    raise StoreBusy(
                        f"{self.path!r} stayed locked for {self.busy_deadline:.0f}s"
                    ) from exc
            finally:
                if turns is not None:
                    turns.give()
            await asyncio.sleep(random.uniform(0, pause))
            # short pauses share a briefly held lock fairly; a lock held long (another
            # process's long transaction) is waited for at a cost of a few tries a second
            cap = BUSY_PAUSE if time.monotonic() - began < BUSY_SHORT else BUSY_PAUSE_LONG
            pause = min(pause * 2, cap)

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        db = self.conn
        db.execute("BEGIN IMMEDIATE")
        try:
            self.check_file()
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self.checkpointer.poke()
        self.checkpointer.fit(db)

    def check_file(self) -> None:
        """Raise SchemaError unless the store's path still names the file this connection
        opened, and that file is not empty: deleted, replaced (a new file, or a copy moved over
        it) or truncated, it is no longer the store others use."""
        if self._file is None:
            return  # not opened yet (prepare() runs before the first write checks it)
        try:
            st = os.stat(self._where)
        except FileNotFoundError:
            problem = "was deleted"
        else:
            if (st.st_dev, st.st_ino) != self._file:
                problem = "was replaced by another file"
            elif st.st_size == 0:
                problem = "was emptied"
            else:
                return
        raise SchemaError(
            f"the SQLite store {self.path!r} {problem} after this process opened it; "
            "nothing more is written to it (start again to use what is there now)"
        )

    async def tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run *fn* in one write transaction, retried as a whole while the database is busy."""

        def run() -> T:
            with self.write() as db:
                return fn(db)

        result = await self.retry(run, turns=self.turns)
        return result


def not_yet(path: str, what: str = "is empty") -> str:
    """The message for a read-only command given a file that holds no store yet."""
    return (
        f"{path!r} {what}: it is not (yet) a contend store; submitting a task or starting "
        "an expert creates one (or check --store)"
    )


def is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text
