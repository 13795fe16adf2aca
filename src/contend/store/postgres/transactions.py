"""A task's own transaction on the PostgreSQL store: a connection of the store's database,
inside a transaction, in which the task writes its effects (to tables of its own, in any schema
of that database) and the store then writes the task's completion with the same fenced
statement ``complete`` uses, so that both commit or neither does.

The connection comes from a pool of its own (``Database.tx_pool``, at most ``pool_size``
connections), so that tasks holding connections for their blocks never delay a renewal. The
claim is checked when the transaction opens (a stale owner does not even start its writes) and
again, under the row lock the completion's ``UPDATE`` takes, just before the commit: while that
lock is held nobody can claim, steal, expire or cancel the task, so what the check saw is what
the commit commits. Both checks read the time with ``clock_timestamp()``: ``now()`` is the
transaction's start and would judge the lease by a moment long past.

Round trips: one to open (``BEGIN`` and the check, one simple query); after the task's last
statement, two (the completion, then ``COMMIT``), a third only for a task that others wait on.
That is how long the task's own row locks are held after its writes. The transaction is begun
by hand, so that psycopg sees it open: the task's ``tx.connection.transaction()`` is a
savepoint.

The transaction is READ COMMITTED (the server's default): a read-modify-write of the task's own
rows wants an atomic ``UPDATE … SET n = n + 1`` or a ``SELECT … FOR UPDATE``. A serialization
failure or a deadlock at the commit is a :class:`~contend.errors.TransactionConflict`.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.errors
from psycopg import AsyncClientCursor, AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import PoolTimeout

from contend.domain import transitions as rules
from contend.domain.task import JSON
from contend.domain.transitions import Holding
from contend.errors import FencedOut, StoreError, TransactionConflict
from contend.store.port import Completion
from contend.store.postgres.apply import apply
from contend.store.postgres.database import Database
from contend.store.postgres.dependants import settle_dependents
from contend.store.postgres.owner_writes import FENCED
from contend.store.postgres.refusals import refusal_now
from contend.store.postgres.url import safe

log = logging.getLogger("contend.store.postgres")

#: Tries to open a transaction when the connection handed out turns out broken.
BEGIN_TRIES = 3
_STATES = [str(s) for s in sorted(rules.WRITE_STATES)]


#: Whether the task has dependants waiting on it, returned with the completion.
HAS_WAITERS = ", EXISTS (SELECT 1 FROM {s}.task_deps d WHERE d.dep_id = applied.id)"


#: Opening: BEGIN and what the store holds of the task, in one round trip (a simple query of
#: two statements, its values bound by the client).
OPEN = (
    "BEGIN; SELECT {now}, (SELECT e.lease_deadline >= {now} FROM {s}.experts e"
    " WHERE e.id = %(expert)s), t.fence, t.owner, t.state, t.lease_deadline"
    " FROM (VALUES (1)) AS one(x) LEFT JOIN {s}.tasks t ON t.id = %(id)s"
)


async def begin(db: Database, expert: str, task_id: str, fence: int) -> PostgresTransaction:
    """A pooled connection inside a new transaction, for *expert*'s task at *fence*."""
    pool = await db.tx_pool()
    for attempt in range(BEGIN_TRIES):
        stack = AsyncExitStack()
        conn: AsyncConnection[TupleRow] | None = None
        try:
            conn = await stack.enter_async_context(pool.connection())
            refused = await _open(db, conn, expert, task_id, fence)
            if refused is not None:
                raise refused
            return PostgresTransaction(conn, expert, task_id, fence, _db=db, _stack=stack)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            await _close(stack, conn, exc)
            if attempt + 1 == BEGIN_TRIES:
                raise StoreError(
                    f"cannot open a transaction on PostgreSQL at {safe(db.dsn)}: {exc}"
                ) from exc
            log.warning("opening a task's transaction failed (%s); trying again", exc)
        except BaseException as exc:
            await _close(stack, conn, exc)
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"PostgreSQL error opening a transaction: {exc}") from exc
            raise
    raise AssertionError("unreachable")


async def _open(
    db: Database, conn: AsyncConnection[TupleRow], expert: str, task_id: str, fence: int
) -> FencedOut | None:
    """BEGIN on *conn* and check the claim: the refusal, or None when the expert holds it.

    The transaction is begun by hand, not with ``conn.transaction()``: psycopg then sees one
    open, so a ``tx.connection.transaction()`` of the task's own is a savepoint."""
    async with AsyncClientCursor(conn) as cur:
        await cur.execute(db.sql(OPEN, live=True), db.params(expert=expert, id=task_id))
        cur.nextset()  # past BEGIN's result, to the SELECT's
        row = await cur.fetchone()
    assert row is not None  # one row, even for a task that does not exist
    now, expert_live, *held = row
    holding = None if held[0] is None else Holding(*held)
    return rules.refusal(
        task_id,
        fence,
        expert,
        holding,
        float(now),
        expert_live=bool(expert_live),
        states=rules.WRITE_STATES,
    )


@dataclass(eq=False)
class PostgresTransaction:
    """``async with ctx.transaction() as tx`` on the PostgreSQL store: ``tx.connection`` is a
    psycopg ``AsyncConnection`` inside the transaction (``await tx.connection.execute(...)``;
    ``tx.connection.transaction()`` makes a savepoint; do not commit or roll back yourself);
    ``tx.result`` is the task's result."""

    connection: AsyncConnection[TupleRow]
    expert: str
    task_id: str
    fence: int
    result: JSON = None
    _db: Database | None = field(default=None, repr=False)
    _stack: AsyncExitStack | None = field(default=None, repr=False)

    async def commit(self, completion: Completion) -> None:
        stack, db = self._take()
        try:
            await self._complete(db, completion)
        except BaseException as exc:
            await _close(stack, self.connection, exc)
            if _is_conflict(exc):
                raise _conflict(self.task_id, exc) from exc
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"task {self.task_id}: PostgreSQL error: {exc}") from exc
            raise
        try:
            try:
                await self.connection.execute("COMMIT")
            finally:
                await stack.aclose()  # the connection goes back (rolled back if need be)
        except psycopg.Error as exc:
            if _is_conflict(exc):
                raise _conflict(self.task_id, exc) from exc
            if not isinstance(exc, psycopg.OperationalError):
                raise StoreError(
                    f"task {self.task_id}: PostgreSQL refused the commit: {exc}"
                ) from exc
            raise StoreError(
                f"task {self.task_id}: the commit got no answer from PostgreSQL ({exc}); "
                "whether it landed is unknown (the task's writes and its completion landed "
                "together or not at all)"
            ) from exc

    async def _complete(self, db: Database, completion: Completion) -> None:
        """Write the completion under the fence, in the transaction; raise why not."""
        status = self.connection.info.transaction_status
        if status == TransactionStatus.INERROR:
            raise StoreError(
                f"task {self.task_id}: a statement of its transaction failed, so PostgreSQL "
                "aborted it; nothing of it is committed"
            )
        if status != TransactionStatus.INTRANS:
            raise StoreError(
                f"task {self.task_id}: its transaction was ended inside the block (a COMMIT or "
                "ROLLBACK of its own); the task is not completed with it"
            )
        tid, fence = completion.task_id, completion.fence
        outcome = rules.completed(self.expert, completion.result_json, in_transaction=True)
        sql, outcomes = apply(
            db, FENCED, [(tid, fence, outcome)], notify=True, returning=HAS_WAITERS, live=True
        )
        async with self.connection.cursor() as cur:
            params: dict[str, Any] = db.params(
                expert=self.expert, states=_STATES, channel=db.channel, **outcomes
            )
            await cur.execute(sql, params)
            rows = await cur.fetchall()
            if not rows:
                why = await refusal_now(db, cur, self.expert, tid, fence, rules.WRITE_STATES)
                raise why or rules.raced(tid, fence)
            if rows[0][2]:
                await settle_dependents(db, cur, [(rows[0][0], rows[0][1])])

    async def rollback(self) -> None:
        if self._stack is None:
            return
        stack, _ = self._take()
        await _close(stack, self.connection, None)

    def _take(self) -> tuple[AsyncExitStack, Database]:
        stack, db = self._stack, self._db
        self._stack = None
        if stack is None or db is None:
            raise RuntimeError(f"the transaction of task {self.task_id} has ended")
        return stack, db


async def _close(
    stack: AsyncExitStack, conn: AsyncConnection[TupleRow] | None, exc: BaseException | None
) -> None:
    """Roll back and give the connection back (the pool discards a broken one); an error
    doing so only means the connection is gone, and its transaction with it."""
    try:
        if conn is not None and conn.info.transaction_status in (
            TransactionStatus.INTRANS,
            TransactionStatus.INERROR,
        ):
            await conn.execute("ROLLBACK")
    except psycopg.Error as close_exc:
        log.debug("rolling back a task's transaction failed: %s", close_exc)
    try:
        if exc is None:
            await stack.aclose()
        else:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
    except psycopg.Error as close_exc:
        log.debug("giving a task's connection back failed: %s", close_exc)


#: The SQLSTATEs of a transaction PostgreSQL rolled back for a conflict: serialization_failure,
#: deadlock_detected (psycopg does not make them subclasses of TransactionRollback).
CONFLICTS = frozenset({"40001", "40P01"})


def _is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.Error) and exc.sqlstate in CONFLICTS


def _conflict(task_id: str, exc: BaseException) -> TransactionConflict:
    return TransactionConflict(
        f"task {task_id}: PostgreSQL refused the transaction as a conflict ({exc}); "
        "nothing was written: run the transaction again"
    )
