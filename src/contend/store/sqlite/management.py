"""Management by hand: cancel and retry."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from contend.domain.task import Task, TaskState, can_move
from contend.errors import InvalidTransition, TaskNotFound
from contend.store.sqlite.connection import Database
from contend.store.sqlite.dependants import settle_dependents
from contend.store.sqlite.inspection import get
from contend.store.sqlite.rows import insert_events


async def _manage(
    db: Database, task_id: str, target: TaskState, operation: str, allowed: Iterable[TaskState]
) -> Task:
    def run(conn: sqlite3.Connection) -> None:
        now = db.clock()
        row = conn.execute(
            "SELECT state, fence, owner FROM tasks WHERE id = ?", (task_id,)
        ).fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        if TaskState(row[0]) not in allowed:
            raise InvalidTransition(task_id, row[0], operation)
        if target == TaskState.CANCELLED:
            conn.execute(
                "UPDATE tasks SET state = 'cancelled', owner = NULL, lease_deadline = NULL, "
                "updated_at = ? WHERE id = ?",
                (now, task_id),
            )
            conn.execute("DELETE FROM task_deps WHERE task_id = ?", (task_id,))
            settle_dependents(conn, now, [(task_id, "cancelled")])
        else:
            conn.execute(
                "UPDATE tasks SET state = 'pending', attempts = 0, run_at = ?, updated_at = ? "
                "WHERE id = ?",
                (now, now, task_id),
            )
        insert_events(
            conn,
            [
                (
                    task_id,
                    now,
                    "cancelled" if target == TaskState.CANCELLED else "retried",
                    row[1],
                    row[2],
                    None,
                )
            ],
        )

    await db.tx(run)
    db.wakeups.touch()
    return await get(db, task_id)


async def cancel(db: Database, task_id: str) -> Task:
    allowed = [s for s in TaskState if can_move(s, TaskState.CANCELLED)]
    return await _manage(db, task_id, TaskState.CANCELLED, "cancel", allowed)


async def retry(db: Database, task_id: str) -> Task:
    allowed = [TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED]
    return await _manage(db, task_id, TaskState.PENDING, "retry", allowed)
