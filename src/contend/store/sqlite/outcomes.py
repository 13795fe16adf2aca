"""Applying the rulebook: the outcomes ``contend.domain.transitions`` decided, written to the
task rows, their history lines, and their effect on dependants.

Nothing here decides. A caller checks what must hold (fence, owner, lease, state), asks the
rulebook for each task's :class:`~contend.domain.transitions.Outcome`, and hands both to
:func:`apply_outcomes` inside its one write transaction.
"""

from __future__ import annotations

import json
import sqlite3
from functools import lru_cache

from contend.domain import transitions as rules
from contend.domain.task import FIRST_STEP, TaskState, if_failed_of
from contend.domain.transitions import Attempts, Event, Outcome
from contend.store.sqlite.rows import EventRow, insert_events

_KEEP = Attempts.KEEP
#: States and events as plain str: sqlite3 binds an enum member (as it does None) through its
#: adapter lookup, at about a microsecond a parameter more than a str.
_TEXT: dict[str, str] = {m: m.value for m in (*TaskState, *Event)}


#: One task's decided outcome, with what its row holds now: (task id, fence, outcome,
#: attempts, run_at). The fence goes into the history line; the outcome's attempts and due time
#: are reckoned from the row's. A plain tuple: one is built per task on the hot path.
Change = tuple[str, int, Outcome, int, float]


def apply_outcomes(conn: sqlite3.Connection, now: float, changes: list[Change]) -> None:
    """Write each outcome and its history line; settle the dependants of the tasks that ended."""
    settle_dependants(conn, now, _write(conn, now, changes))


#: The bits of an UPDATE's shape: what an outcome changes besides the state and updated_at.
_ATTEMPTS, _RUN_AT, _ERROR, _RESULT, _OWNED = 1, 2, 4, 8, 16


def _write(
    conn: sqlite3.Connection, now: float, changes: list[Change]
) -> list[tuple[str, TaskState]]:
    """Update the rows (one statement per shape of outcome) and add the history lines; return
    the tasks that reached a terminal state. Written for speed: it runs per task, inside the
    write lock."""
    updates: dict[int, list[list[object]]] = {}
    events: list[EventRow] = []
    ended: list[tuple[str, TaskState]] = []
    for tid, fence, o, attempts, run_at in changes:
        new_attempts = attempts if o.attempts is _KEEP else o.attempts.apply(attempts)
        new_run_at = (
            run_at
            if o.due_in is None and not o.due_now and not o.due_by_now
            else o.run_at(run_at, now)
        )
        error, result = o.error_json, o.result_json
        params: list[object] = [_TEXT[o.state]]
        shape = _OWNED if o.owned else 0
        if new_attempts != attempts:
            params.append(new_attempts)
            shape |= _ATTEMPTS
        if new_run_at != run_at:  # a new due time: the age restarts from it
            params.append(new_run_at)
            params.append(new_run_at + FIRST_STEP)
            shape |= _RUN_AT
        if error is not None:
            params.append(error)
            shape |= _ERROR
        if result is not None:
            params.append(result)
            shape |= _RESULT
        params.append(now)
        params.append(tid)
        rows = updates.get(shape)
        if rows is None:
            rows = updates[shape] = []
        rows.append(params)
        events.append((tid, now, _TEXT[o.event], fence, o.actor, o.detail or ""))
        if o.ends:
            ended.append((tid, o.state))
    for shape, rows in updates.items():
        conn.executemany(_update_sql(shape), rows)
    insert_events(conn, events)
    return ended


@lru_cache(maxsize=32)
def _update_sql(shape: int) -> str:
    """The UPDATE for one shape of outcome: the columns it changes, in the order of the
    parameters :func:`_write` passes."""
    sets = ["state = ?"]
    if shape & _ATTEMPTS:
        sets.append("attempts = ?")
    if shape & _RUN_AT:
        sets.append("run_at = ?, eff_priority = priority, promote_at = ?")  # domain.task.unaged
    if shape & _ERROR:
        sets.append("error = ?")
    if shape & _RESULT:
        sets.append("result = ?")
    if not shape & _OWNED:
        sets.append("owner = NULL, lease_deadline = NULL")
    sets.append("updated_at = ?")
    return f"UPDATE tasks SET {', '.join(sets)} WHERE id = ?"


def attempts_sql(attempts: Attempts) -> str:
    """The ``SET`` term for the attempt count of a claim or a steal, which are written in one
    statement without reading the row first ("" when the count stays)."""
    if attempts is Attempts.KEEP:
        return ""
    if attempts is Attempts.COUNT:
        return ", attempts = attempts + 1"
    raise ValueError(f"a claim cannot apply attempts={attempts} without reading the row")


def settle_dependants(
    conn: sqlite3.Connection, now: float, ended: list[tuple[str, TaskState]]
) -> None:
    """The tasks in *ended* reached a terminal state: each task waiting on one of them gets
    the rulebook's outcome of that dependency's end (one fewer to wait for, ready, or dead),
    and a dependant that ends in turn settles its own, cascading."""
    todo = list(ended)
    while todo:
        batch, todo = todo[:500], todo[500:]
        state_of = dict(batch)
        marks = ",".join("?" * len(batch))
        edges = conn.execute(
            f"DELETE FROM task_deps WHERE dep_id IN ({marks}) RETURNING dep_id, task_id",
            [tid for tid, _ in batch],
        ).fetchall()
        for dep_id, dep_tid in sorted(edges):
            row = conn.execute(
                "UPDATE tasks SET deps_left = deps_left - 1, updated_at = ? "
                "WHERE id = ? AND state = ? "
                "RETURNING deps_left + 1, fence, attempts, run_at, depends_on, if_failed",
                (now, dep_tid, TaskState.WAITING),
            ).fetchone()
            if row is None:
                continue  # it no longer waits (cancelled, or dead of another dependency)
            choice = if_failed_of(_listed(row[4]), _listed(row[5]), dep_id)
            outcome = rules.dependency_ended(dep_id, state_of[dep_id], row[0], choice)
            if outcome is not None:
                todo += _write(conn, now, [(dep_tid, row[1], outcome, row[2], row[3])])


def _listed(text: str | None) -> list[str]:
    """A JSON list of strings kept in a column (NULL: none)."""
    return json.loads(text) if text else []


def drop_edges(conn: sqlite3.Connection, tasks: list[tuple[str, str | None]]) -> None:
    """Delete the dependency edges of tasks that wait on nothing any more (cancelled, pruned),
    given as (id, its ``depends_on`` column): each by the edges' key (dependency, task), not
    by the task's id, which the key does not lead with (a read of every edge, per task)."""
    edges = [(dep, tid) for tid, deps in tasks for dep in _listed(deps)]
    if edges:
        conn.executemany("DELETE FROM task_deps WHERE dep_id = ? AND task_id = ?", edges)
