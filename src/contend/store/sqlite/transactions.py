"""A task's own transaction on the SQLite store: a connection of its own to the store's file,
inside ``BEGIN IMMEDIATE``, in which the task writes its effects (to tables of its own in the
same file) and the store then writes the task's completion, checked under the fence, so that
both commit or neither does.

SQLite has one writer at a time, and an ``sqlite3`` call cannot be awaited: a transaction that
found the database busy in the middle of the task's statements would have to block the event
loop. So the write lock is taken at ``begin`` (retried with short random pauses, as every write
of the store is) and held until the commit or rollback; the task's statements never wait. Every
other writer, in this process and others, waits meanwhile: keep the block to the database work
(``promises.exclusive_transactions``). While the lock is held nobody else can claim the task,
so the only check that can fail at commit is the lease's (the block outlived it), besides a
claim already lost at ``begin``.

The tasks of one process queue for the lock on an ``asyncio.Lock`` (no polling between them);
their connections are kept for the next transaction, a few at most. A process whose tasks
queue would take the lock back the instant it let it go, every time, while every other writer
(another process's, this process's own renewal) sleeps between its tries: after a few
transactions back to back it pauses as long as they do, so that the lock changes hands.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from dataclasses import dataclass, field

from contend.domain import transitions as rules
from contend.domain.task import JSON
from contend.errors import StoreError
from contend.store.port import Completion
from contend.store.sqlite.checkpoints import Writer, writer
from contend.store.sqlite.connection import Database
from contend.store.sqlite.outcomes import apply_outcomes
from contend.store.sqlite.owner_writes import check_owners

#: Idle connections kept for later transactions; more are closed.
IDLE_CONNECTIONS = 4
#: Transactions of one process back to back (each begun within FAIR_PAUSE of the last one's
#: end) before the next one pauses up to FAIR_PAUSE seconds: the longest pause between two
#: tries of a busy write (``Database.retry``).
STREAK = 3
FAIR_PAUSE = 0.004


class Transactions:
    """The part of the store that opens tasks' transactions: their connections and the lock
    that orders the tasks of this process."""

    def __init__(self, db: Database, sync: str) -> None:
        self._db = db
        self._sync = sync
        self._idle: list[Writer] = []
        self._lock = asyncio.Lock()
        self._ended = 0.0  # time.monotonic() when the last transaction let the lock go
        self._streak = 0

    def _connect(self) -> Writer:
        if self._idle:
            return self._idle.pop()
        self._db.conn  # noqa: B018 -- raises StoreError when the store is not open
        try:
            return writer(self._db.path, self._sync)  # checkpoints.py
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self._db.path!r}: {exc}") from exc

    def _end(self, conn: Writer, *, reuse: bool) -> None:
        """The transaction on *conn* is over: keep the connection (or close it) and let the
        next task of this process take the lock."""
        if reuse and not conn.in_transaction and len(self._idle) < IDLE_CONNECTIONS:
            self._idle.append(conn)
        else:
            conn.close()
        self._ended = time.monotonic()
        self._lock.release()

    async def _take_turn(self) -> None:
        """Pause before taking the lock again after a streak of back-to-back transactions."""
        if time.monotonic() - self._ended > FAIR_PAUSE:
            self._streak = 0
            return
        self._streak += 1
        if self._streak >= STREAK:
            self._streak = 0
            await asyncio.sleep(random.uniform(FAIR_PAUSE / 2, FAIR_PAUSE))

    async def begin(self, expert: str, task_id: str, fence: int) -> SQLiteTransaction:
        """Take the write lock on a connection of the task's own and check the claim."""
        await self._lock.acquire()
        try:
            await self._take_turn()
            conn = self._connect()
            self._db.checkpointer.fit(conn)
        except BaseException:
            self._lock.release()
            raise
        try:
            await self._db.retry(lambda: conn.execute("BEGIN IMMEDIATE"))
            (refused,), _ = check_owners(
                conn, self._db.clock(), expert, [(task_id, fence)], rules.WRITE_STATES
            )
            if refused is not None:
                raise refused
        except BaseException:
            _rollback(conn)
            self._end(conn, reuse=True)
            raise
        return SQLiteTransaction(conn, expert, task_id, fence, _part=self)

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


@dataclass(eq=False)
class SQLiteTransaction:
    """``async with ctx.transaction() as tx`` on the SQLite store: ``tx.connection`` is an
    ``sqlite3.Connection`` to the store's file, inside the transaction (run statements on it;
    do not commit or roll back yourself); ``tx.result`` is the task's result."""

    connection: Writer
    expert: str
    task_id: str
    fence: int
    result: JSON = None
    _part: Transactions | None = field(default=None, repr=False)

    async def commit(self, completion: Completion) -> None:
        conn, part = self.connection, self._take()
        db = part._db
        try:
            if not conn.in_transaction:
                raise StoreError(
                    f"task {self.task_id}: its transaction was ended inside the block (a COMMIT "
                    "or ROLLBACK of its own, or SQLite rolled it back after an error); the task "
                    "is not completed with it"
                )
            now = db.clock()
            (refused,), ok = check_owners(
                conn, now, self.expert, [(completion.task_id, completion.fence)], rules.WRITE_STATES
            )
            if refused is not None:
                raise refused
            (_, row) = ok[0]
            outcome = rules.completed(self.expert, completion.result_json, in_transaction=True)
            apply_outcomes(conn, now, [(row[0], row[1], outcome, row[5], row[6])])
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite error on {db.path!r} at commit: {exc}") from exc
        except BaseException:
            part._end(conn, reuse=_rollback(conn))
            raise
        part._end(conn, reuse=True)
        db.checkpointer.poke()
        db.wakeups.touch()  # dependants may have become pending

    async def rollback(self) -> None:
        if self._part is None:
            return
        part = self._take()
        ok = _rollback(self.connection)
        part._end(self.connection, reuse=ok)

    def _take(self) -> Transactions:
        part, self._part = self._part, None
        if part is None:
            raise RuntimeError(f"the transaction of task {self.task_id} has ended")
        return part


def _rollback(conn: sqlite3.Connection) -> bool:
    """Roll back whatever is open on *conn*; False when the connection is not fit to reuse."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return True
    except sqlite3.Error:
        return False
