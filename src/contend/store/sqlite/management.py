"""Management by hand: cancel and retry, as the rulebook decides them."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from contend.domain import transitions as rules
from contend.domain.task import Task, TaskState
from contend.domain.transitions import Outcome
from contend.errors import TaskNotFound
from contend.store.sqlite.connection import Database
from contend.store.sqlite.inspection import get
from contend.store.sqlite.outcomes import apply_outcomes, drop_edges


async def _manage(
    db: Database, task_id: str, decide: Callable[[TaskState, str | None], Outcome]
) -> Task:
    """Apply ``decide(state, owner)`` to the task (it raises when the state refuses it)."""

    def run(conn: sqlite3.Connection) -> None:
        now = db.clock()
        row = conn.execute(
            "SELECT state, fence, owner, attempts, run_at, depends_on FROM tasks WHERE id = ?",
            (task_id,),
        ).fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        outcome = decide(TaskState(row[0]), row[2])
        if outcome.ends:  # it waits on nothing any more
            drop_edges(conn, [(task_id, row[5])])
        apply_outcomes(conn, now, [(task_id, row[1], outcome, row[3], row[4])])

    await db.tx(run)
    db.wakeups.touch()
    return await get(db, task_id)


async def cancel(db: Database, task_id: str) -> Task:
    return await _manage(db, task_id, lambda state, owner: rules.cancelled(task_id, state, owner))


async def retry(db: Database, task_id: str) -> Task:
    return await _manage(db, task_id, lambda state, owner: rules.retried(task_id, state))
