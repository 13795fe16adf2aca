"""Auctions: bids written during a bidding window, and dropping the auctions of tasks that are
no longer pending."""

from __future__ import annotations

import sqlite3

from contend.domain import auction
from contend.errors import TaskNotFound
from contend.store._common import check_bid
from contend.store.port import Auction
from contend.store.sqlite.connection import Database
from contend.store.sqlite.sessions import check_session


async def bid(
    db: Database,
    expert: str,
    session: str,
    task_id: str,
    score: float,
    window: float,
    grace: float = auction.DEFAULT_GRACE,
) -> Auction:
    score, window, grace = check_bid(score, window, grace)

    def run(conn: sqlite3.Connection) -> Auction:
        now = db.clock()
        check_session(conn, expert, session, now)
        row = conn.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        conn.execute(
            "INSERT INTO auctions (task_id, closes_at, grace) VALUES (?, ?, ?) "
            "ON CONFLICT (task_id) DO NOTHING",
            (task_id, now + window, grace),
        )
        closes, grace_ = conn.execute(
            "SELECT closes_at, grace FROM auctions WHERE task_id = ?", (task_id,)
        ).fetchone()
        if row[0] != "pending":
            return Auction(task_id, now, closes, (), open=False, grace=grace_)
        if now < closes:  # sealed at the close: a later bid is not ranked
            conn.execute(
                "INSERT INTO bids (task_id, expert, score, at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (task_id, expert) DO UPDATE SET score = excluded.score",
                (task_id, expert, score, now),
            )
        return Auction(task_id, now, closes, _ranked(conn, task_id), grace=grace_)

    return await db.tx(run)


def _ranked(conn: sqlite3.Connection, task_id: str) -> tuple[tuple[str, float], ...]:
    rows = conn.execute("SELECT expert, score, at FROM bids WHERE task_id = ?", (task_id,))
    return auction.rank_bids({r[0]: (r[1], r[2]) for r in rows})


def held_back(conn: sqlite3.Connection, expert: str, now: float) -> list[str]:
    """The tasks whose auction does not let *expert* claim yet (``contend.domain.auction``):
    of the auctions that still hold anyone back, those where its rank's turn has not come."""
    live = conn.execute(
        "SELECT a.task_id, a.closes_at, a.grace FROM auctions a WHERE ? < a.closes_at + "
        "a.grace * (SELECT count(*) FROM bids b WHERE b.task_id = a.task_id)",
        (now,),
    ).fetchall()
    return [
        tid
        for tid, closes, grace in live
        if now < auction.may_claim_at(closes, grace, _ranked(conn, tid), expert)
    ]


async def clear_closed_auctions(db: Database) -> None:
    """Drop auctions and bids of tasks that are no longer pending.

    CROSS JOIN keeps the auctions (few, often none) the outer loop: with JOIN, SQLite chose
    to scan every task and look each one's auction up, on every expiry round of every
    expert. That scan grew with the table (pickup p99 from 3 to 50 ms over ten minutes at
    1,000 tasks/s) and, with a reader holding the WAL back, with the WAL (each page of it
    looked up in the WAL index: p99 0.5-0.9 s)."""
    stale = await db.retry(
        lambda: db.conn.execute(
            "SELECT 1 FROM auctions a CROSS JOIN tasks t ON t.id = a.task_id "
            "WHERE t.state != 'pending' LIMIT 1"
        ).fetchone()
    )
    if stale is None:
        return

    def run(conn: sqlite3.Connection) -> None:
        done = (
            "(SELECT a.task_id FROM auctions a CROSS JOIN tasks t ON t.id = a.task_id "
            "WHERE t.state != 'pending')"
        )
        conn.execute(f"DELETE FROM bids WHERE task_id IN {done}")
        conn.execute(f"DELETE FROM auctions WHERE task_id IN {done}")

    await db.tx(run)
