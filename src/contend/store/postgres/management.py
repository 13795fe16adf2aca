"""Management by hand: cancel and retry (one task each), and purging a schema for benchmarks."""

from __future__ import annotations

from collections.abc import Callable

from contend.domain import transitions as rules
from contend.domain.task import TaskState
from contend.domain.transitions import Outcome
from contend.errors import TaskNotFound
from contend.store.postgres.apply import LOCKED, apply, lowers
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.dependants import settle_dependents


async def _manage(
    db: Database, task_id: str, decide: Callable[[TaskState, str | None], Outcome]
) -> None:
    """Apply to the task, locked, what *decide* makes of its state and owner (it raises
    :class:`~contend.errors.InvalidTransition` for a state the operation does not accept)."""

    async def run(cur: Cursor) -> None:
        await cur.execute(
            db.sql("SELECT state, fence, owner FROM {s}.tasks WHERE id = %s FOR UPDATE"),
            (task_id,),
        )
        row = await cur.fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        outcome = decide(TaskState(row[0]), row[2])
        sql, outcomes = apply(db, LOCKED, [(task_id, row[1], outcome)])
        await cur.execute(sql, db.params(**outcomes))
        if outcome.ends:  # a task that ended waits on nothing, and its dependants are told
            await cur.execute(db.sql("DELETE FROM {s}.task_deps WHERE task_id = %s"), (task_id,))
            await settle_dependents(db, cur, [(task_id, str(outcome.state))])
        await db.notify(cur, lowered=lowers(outcome))

    await db.run(run)


async def cancel(db: Database, task_id: str) -> None:
    await _manage(db, task_id, lambda state, owner: rules.cancelled(task_id, state, owner))


async def retry(db: Database, task_id: str) -> None:
    await _manage(db, task_id, lambda state, _: rules.retried(task_id, state))


async def purge_all(db: Database) -> None:
    """Delete every task, its history and every expert in this schema."""

    async def run(cur: Cursor) -> None:
        await cur.execute(db.sql("TRUNCATE {s}.tasks, {s}.task_deps, {s}.task_events, {s}.experts"))
        await db.notify(cur)

    await db.run(run)
