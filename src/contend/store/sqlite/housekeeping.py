"""Housekeeping: return tasks whose lease lapsed, age pending tasks' priority, and drop the
auctions of tasks that are no longer pending."""

from __future__ import annotations

import sqlite3

from contend.domain import transitions as rules
from contend.domain.task import aged_priority, next_promotion
from contend.store.sqlite.auctions import clear_closed_auctions
from contend.store.sqlite.connection import Database
from contend.store.sqlite.outcomes import apply_outcomes


async def expire(db: Database) -> int:
    def run(conn: sqlite3.Connection) -> int:
        now = db.clock()
        lapsed = conn.execute(
            "SELECT id, owner, fence, attempts, max_attempts, run_at FROM tasks "
            "WHERE state IN ('claimed', 'running') AND lease_deadline < ?",
            (now,),
        ).fetchall()
        if not lapsed:
            return 0
        changes = [
            (tid, fence, rules.expired(owner, attempts, most), attempts, run_at)
            for tid, owner, fence, attempts, most, run_at in lapsed
        ]
        apply_outcomes(conn, now, changes)
        conn.execute("DELETE FROM experts WHERE lease_deadline < ?", (now - 3600,))
        return len(lapsed)

    await clear_closed_auctions(db)
    # A cheap read first: most calls find nothing to do and need no write lock.
    now = db.clock()
    due = await db.retry(
        lambda: db.conn.execute(
            "SELECT 1 FROM tasks WHERE state IN ('claimed', 'running') AND lease_deadline < ? LIMIT 1",
            (now,),
        ).fetchone()
    )
    moved = 0 if due is None else await db.tx(run)
    if moved:
        db.wakeups.touch()
    await _age(db)  # after the lapse: returned tasks catch up on their ageing too
    return moved


async def end_session(db: Database, expert: str, session: str) -> int:
    """End *session* of *expert* and send its tasks through expiry, in one transaction."""

    def run(conn: sqlite3.Connection) -> int:
        now = db.clock()
        ended = conn.execute(
            "UPDATE experts SET lease_deadline = min(lease_deadline, ?), load = 0 "
            "WHERE id = ? AND session = ? RETURNING 1",
            (now - 1e-6, expert, session),
        ).fetchone()
        if ended is None:
            return 0
        # Every claim of the expert's name: this session's, and any a lapsed one left behind.
        held = conn.execute(
            "SELECT id, fence, attempts, max_attempts, run_at FROM tasks "
            "WHERE owner = ? AND state IN ('claimed', 'running')",
            (expert,),
        ).fetchall()
        changes = [
            (tid, fence, rules.expired(expert, attempts, most, session_ended=True), attempts, at)
            for tid, fence, attempts, most, at in held
        ]
        apply_outcomes(conn, now, changes)
        return len(held)

    moved = await db.tx(run)
    db.wakeups.touch()
    return moved


async def _age(db: Database) -> None:
    """Ageing: raise the effective priority of pending tasks whose next step is due, reckoned
    from their due time; nothing to write before a task of a priority other than 0 was ever
    submitted (``domain.task.AGEING``: the ``levels`` key of ``contend_meta``)."""
    now = db.clock()
    due = await db.retry(
        lambda: db.conn.execute(
            # by the partial index on promote_at: SQLite's own choice, the index on (state,
            # queue), read every pending task to find the few due (the whole backlog, in
            # every expert's expiry round)
            "SELECT id, priority, run_at FROM tasks INDEXED BY tasks_ageing "
            "WHERE state = 'pending' AND promote_at <= ? "
            "AND EXISTS (SELECT 1 FROM contend_meta WHERE key = 'levels') LIMIT 5000",
            (now,),
        ).fetchall()
    )
    if not due:
        return
    updates = []
    for tid, priority, run_at in due:
        aged = aged_priority(priority, now - run_at)
        updates.append((aged, next_promotion(priority, aged, run_at), tid))

    def run(conn: sqlite3.Connection) -> None:
        conn.executemany(
            "UPDATE tasks SET eff_priority = ?, promote_at = ? WHERE id = ? AND state = 'pending'",
            updates,
        )

    await db.tx(run)
