"""Dependants: when a task ends, the tasks waiting on it become pending (all their dependencies
succeeded) or dead (one did not), cascading."""

from __future__ import annotations

import sqlite3

from contend.store.sqlite.rows import error_json


def settle_dependents(conn: sqlite3.Connection, now: float, done: list[tuple[str, str]]) -> None:
    """Tasks in *done* reached a terminal state: wake their dependents (all deps
    succeeded) or kill them (a dep did not succeed), cascading."""
    todo = list(done)
    while todo:
        batch, todo = todo[:500], todo[500:]
        state_of = dict(batch)
        marks = ",".join("?" * len(batch))
        edges = conn.execute(
            f"DELETE FROM task_deps WHERE dep_id IN ({marks}) RETURNING dep_id, task_id",
            [tid for tid, _ in batch],
        ).fetchall()
        for dep_id, dep_tid in sorted(edges):
            state = state_of[dep_id]
            if state == "succeeded":
                conn.execute(
                    "UPDATE tasks SET deps_left = deps_left - 1, "
                    "state = CASE WHEN deps_left = 1 THEN 'pending' ELSE state END, "
                    "run_at = CASE WHEN deps_left = 1 THEN max(run_at, ?) ELSE run_at END, "
                    "updated_at = ? WHERE id = ? AND state = 'waiting'",
                    (now, now, dep_tid),
                )
            else:
                hit = conn.execute(
                    "UPDATE tasks SET state = 'dead', error = ?, updated_at = ? "
                    "WHERE id = ? AND state = 'waiting' RETURNING id",
                    (
                        error_json("DependencyFailed", f"dependency {dep_id} ended {state}"),
                        now,
                        dep_tid,
                    ),
                ).fetchone()
                if hit:
                    todo.append((dep_tid, "dead"))
