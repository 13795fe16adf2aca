"""Management by hand: cancel and retry (one task each), and purging a schema for benchmarks."""

from __future__ import annotations

from collections.abc import Iterable

from contend.domain.task import TaskState, can_move
from contend.errors import InvalidTransition, TaskNotFound
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.dependants import settle_dependents


async def _manage(
    db: Database, task_id: str, target: TaskState, operation: str, allowed: Iterable[TaskState]
) -> None:
    allowed_states = frozenset(allowed)

    async def run(cur: Cursor) -> None:
        await cur.execute(
            db.sql("SELECT state, fence, owner FROM {s}.tasks WHERE id = %s FOR UPDATE"),
            (task_id,),
        )
        row = await cur.fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        if TaskState(row[0]) not in allowed_states:
            raise InvalidTransition(task_id, row[0], operation)
        if target == TaskState.CANCELLED:
            await cur.execute(
                db.sql(
                    "UPDATE {s}.tasks SET state = 'cancelled', owner = NULL, "
                    "lease_deadline = NULL, updated_at = {now} WHERE id = %(id)s"
                ),
                db.params(id=task_id),
            )
            await cur.execute(db.sql("DELETE FROM {s}.task_deps WHERE task_id = %s"), (task_id,))
            await settle_dependents(db, cur, [(task_id, "cancelled")])
            event = "cancelled"
        else:
            await cur.execute(
                db.sql(
                    "UPDATE {s}.tasks SET state = 'pending', attempts = 0, run_at = {now}, "
                    "updated_at = {now} WHERE id = %(id)s"
                ),
                db.params(id=task_id),
            )
            event = "retried"
        await cur.execute(
            db.sql(
                "INSERT INTO {s}.task_events (task_id, at, event, fence, expert) "
                "VALUES (%(id)s, {now}, %(event)s, %(fence)s, %(expert)s)"
            ),
            db.params(id=task_id, event=event, fence=row[1], expert=row[2]),
        )
        await db.notify(cur)

    await db.run(run)


async def cancel(db: Database, task_id: str) -> None:
    allowed = [s for s in TaskState if can_move(s, TaskState.CANCELLED)]
    await _manage(db, task_id, TaskState.CANCELLED, "cancel", allowed)


async def retry(db: Database, task_id: str) -> None:
    allowed = [TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED]
    await _manage(db, task_id, TaskState.PENDING, "retry", allowed)


async def purge_all(db: Database) -> None:
    """Delete every task, its history and every expert in this schema."""

    async def run(cur: Cursor) -> None:
        await cur.execute(db.sql("TRUNCATE {s}.tasks, {s}.task_deps, {s}.task_events, {s}.experts"))
        await db.notify(cur)

    await db.run(run)
