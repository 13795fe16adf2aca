"""Auctions: bids written during a bidding window, and dropping the auctions of tasks that are
no longer pending."""

from __future__ import annotations

import sqlite3

from contend.errors import TaskNotFound
from contend.store._common import check_bid, rank_bids
from contend.store.port import Auction
from contend.store.sqlite.connection import Database
from contend.store.sqlite.sessions import check_session


async def bid(
    db: Database, expert: str, session: str, task_id: str, score: float, window: float
) -> Auction:
    score, window = check_bid(score, window)

    def run(conn: sqlite3.Connection) -> Auction:
        now = db.clock()
        check_session(conn, expert, session, now)
        row = conn.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        conn.execute(
            "INSERT INTO auctions (task_id, closes_at) VALUES (?, ?) "
            "ON CONFLICT (task_id) DO NOTHING",
            (task_id, now + window),
        )
        closes = conn.execute(
            "SELECT closes_at FROM auctions WHERE task_id = ?", (task_id,)
        ).fetchone()[0]
        if row[0] != "pending":
            return Auction(task_id, now, closes, (), open=False)
        conn.execute(
            "INSERT INTO bids (task_id, expert, score, at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (task_id, expert) DO UPDATE SET score = excluded.score",
            (task_id, expert, score, now),
        )
        bids = {
            r[0]: (r[1], r[2])
            for r in conn.execute(
                "SELECT expert, score, at FROM bids WHERE task_id = ?", (task_id,)
            )
        }
        return Auction(task_id, now, closes, rank_bids(bids))

    return await db.tx(run)


async def clear_closed_auctions(db: Database) -> None:
    """Drop auctions and bids of tasks that are no longer pending."""
    stale = await db.retry(
        lambda: db.conn.execute(
            "SELECT 1 FROM auctions a JOIN tasks t ON t.id = a.task_id "
            "WHERE t.state != 'pending' LIMIT 1"
        ).fetchone()
    )
    if stale is None:
        return

    def run(conn: sqlite3.Connection) -> None:
        done = (
            "(SELECT a.task_id FROM auctions a JOIN tasks t ON t.id = a.task_id "
            "WHERE t.state != 'pending')"
        )
        conn.execute(f"DELETE FROM bids WHERE task_id IN {done}")
        conn.execute(f"DELETE FROM auctions WHERE task_id IN {done}")

    await db.tx(run)
