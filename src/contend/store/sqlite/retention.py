"""Retention: deleting old finished tasks whole, and capping each task's history
(``contend.domain.retention`` says which tasks and how much)."""

from __future__ import annotations

import sqlite3

from contend.domain.retention import PRUNABLE_STATES, check_prune
from contend.store.sqlite.connection import Database

#: The finished states, the one the ``tasks_done`` index covers first.
_STATES = ("succeeded", *sorted(str(s) for s in PRUNABLE_STATES if str(s) != "succeeded"))


async def prune(db: Database, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
    before, limit, keep_events = check_prune(before, limit, keep_events)

    # History: up to *limit* tasks over the cap, found by a read that takes no lock (it
    # walks the whole history index: housekeeping prunes once a minute, not every heartbeat).
    long = await db.retry(
        lambda: db.conn.execute(
            "SELECT task_id FROM task_events GROUP BY task_id HAVING count(*) > ? LIMIT ?",
            (keep_events, limit),
        ).fetchall()
    )

    def run(conn: sqlite3.Connection) -> int:
        found: list[tuple[float, str]] = []
        for state in _STATES:  # each state by its own index, oldest first
            found += conn.execute(
                "SELECT updated_at, id FROM tasks t WHERE state = ? AND updated_at < ? "
                # a dependency's edges go when it ends and its waiters are settled: one that
                # still has some is waited on
                "AND NOT EXISTS (SELECT 1 FROM task_deps d WHERE d.dep_id = t.id) "
                "ORDER BY updated_at LIMIT ?",
                (state, before, limit),
            ).fetchall()
        ids = [(tid,) for _, tid in sorted(found)[:limit]]
        if ids:
            conn.executemany("DELETE FROM task_events WHERE task_id = ?", ids)
            conn.executemany("DELETE FROM task_deps WHERE task_id = ?", ids)
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
