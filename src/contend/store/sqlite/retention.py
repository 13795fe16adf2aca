"""Retention: deleting old finished tasks whole, and capping each task's history
(``contend.domain.retention`` says which tasks and how much)."""

from __future__ import annotations

import sqlite3
from time import monotonic

from contend.domain.retention import PRUNABLE_STATES, TRIM_EVERY, check_prune
from contend.store.sqlite.connection import Database
from contend.store.sqlite.outcomes import drop_edges

#: History lines whose tasks one pass checks against the cap.
TRIM_WINDOW = 5000
#: The finished states but succeeded (which the ``tasks_done`` index covers).
_OTHERS = sorted(str(s) for s in PRUNABLE_STATES if str(s) != "succeeded")


async def prune(db: Database, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
    before, limit, keep_events = check_prune(before, limit, keep_events)

    # History: the tasks of the next TRIM_WINDOW history lines (a cursor that goes round the
    # table, one step a pass, so a pass costs the same on any size of store) that are over
    # the cap; a read that takes no lock. At most once in TRIM_EVERY seconds.
    since = db.trim_cursor

    def find_long() -> list[tuple[str]]:
        window = db.conn.execute(
            "SELECT max(rowid), count(*) FROM (SELECT rowid FROM task_events WHERE rowid > ?"
            " ORDER BY rowid LIMIT ?)",
            (since, TRIM_WINDOW),
        ).fetchone()
        last, seen = window
        db.trim_cursor = 0 if seen < TRIM_WINDOW or last is None else last
        return db.conn.execute(
            "SELECT w.task_id FROM (SELECT DISTINCT task_id FROM task_events"
            " WHERE rowid > ? AND rowid <= ?) w WHERE (SELECT count(*) FROM task_events e"
            " WHERE e.task_id = w.task_id) > ? LIMIT ?",
            (since, last if last is not None else since, keep_events, limit),
        ).fetchall()

    long: list[tuple[str]] = []
    if monotonic() >= db.trim_next:
        db.trim_next = monotonic() + TRIM_EVERY
        long = await db.retry(find_long)

    def run(conn: sqlite3.Connection) -> int:
        # Succeeded tasks, the most, by the partial index on their updated_at (a literal
        # state: SQLite uses a partial index only where the query implies its WHERE); the
        # other finished states by the state index. A dependency's edges go when it ends and
        # its waiters are settled: one that still has some is waited on.
        unsettled = "NOT EXISTS (SELECT 1 FROM task_deps d WHERE d.dep_id = t.id)"
        found: list[tuple[float, str, str | None]] = conn.execute(
            "SELECT updated_at, id, depends_on FROM tasks t INDEXED BY tasks_done "
            f"WHERE state = 'succeeded' AND updated_at < ? AND {unsettled} "
            "ORDER BY updated_at LIMIT ?",
            (before, limit),
        ).fetchall()
        for state in _OTHERS:
            found += conn.execute(
                f"SELECT updated_at, id, depends_on FROM tasks t WHERE state = ? AND updated_at < ? "
                f"AND {unsettled} ORDER BY updated_at LIMIT ?",
                (state, before, limit),
            ).fetchall()
        chosen = sorted(found)[:limit]
        ids = [(tid,) for _, tid, _ in chosen]
        if ids:
            conn.executemany("DELETE FROM task_events WHERE task_id = ?", ids)
            drop_edges(conn, [(tid, deps) for _, tid, deps in chosen])
            conn.executemany("DELETE FROM bids WHERE task_id = ?", ids)
            conn.executemany("DELETE FROM auctions WHERE task_id = ?", ids)
            conn.executemany("DELETE FROM tasks WHERE id = ?", ids)
        for (tid,) in long:  # keep the first line and the newest
            conn.execute(
                "DELETE FROM task_events WHERE task_id = ?1 AND rowid NOT IN ("
                " SELECT min(rowid) FROM task_events WHERE task_id = ?1"
                " UNION ALL SELECT rowid FROM ("
                "  SELECT rowid FROM task_events WHERE task_id = ?1 ORDER BY rowid DESC LIMIT ?2"
                " ))",
                (tid, keep_events - 1),
            )
        return len(ids)

    deleted = await db.tx(run)
    if deleted:
        db.wakeups.touch()
    return deleted
