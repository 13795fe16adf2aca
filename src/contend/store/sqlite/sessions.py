"""Expert sessions: register, renew (the heartbeat that keeps every claim of the session alive)
and deregister; and the live-session check that claims and bids make."""

from __future__ import annotations

import json
import sqlite3
import uuid

from contend.store._common import check_ttl, live_elsewhere, session_not_live
from contend.store.port import ExpertInfo, Heartbeat
from contend.store.sqlite.connection import Database


def check_session(conn: sqlite3.Connection, expert: str, session: str, now: float) -> None:
    """Raise :class:`LeaseLost` unless *session* is the live session of *expert*."""
    row = conn.execute(
        "SELECT session, lease_deadline FROM experts WHERE id = ?", (expert,)
    ).fetchone()
    if row is None or row[0] != session or row[1] < now:
        raise session_not_live(expert, session)


async def register_expert(db: Database, info: ExpertInfo, lease_ttl: float) -> str:
    ttl = check_ttl(lease_ttl)
    session = uuid.uuid4().hex

    def run(conn: sqlite3.Connection) -> None:
        now = db.clock()
        row = conn.execute(
            "SELECT info, lease_deadline FROM experts WHERE id = ?", (info.id,)
        ).fetchone()
        if row is not None and row[1] >= now:
            other = ExpertInfo.from_json_text(row[0])
            raise live_elsewhere(info.id, other.host, other.pid)
        if row is not None:
            # The old session's claims end with it: a new session never inherits them.
            conn.execute(
                "UPDATE tasks SET lease_deadline = min(lease_deadline, ?) "
                "WHERE owner = ? AND state IN ('claimed', 'running')",
                (row[1], info.id),
            )
        conn.execute(
            "INSERT OR REPLACE INTO experts (id, session, info, lease_deadline, heartbeat_at, "
            "started_at) VALUES (?, ?, ?, ?, ?, ?)",
            (info.id, session, info.to_json_text(), now + ttl, now, now),
        )

    await db.tx(run)
    return session


async def renew(
    db: Database, expert: str, session: str, lease_ttl: float, beat: Heartbeat
) -> dict[str, int]:
    ttl = check_ttl(lease_ttl)

    def run(conn: sqlite3.Connection) -> dict[str, int]:
        now = db.clock()
        check_session(conn, expert, session, now)
        conn.execute(
            "UPDATE experts SET lease_deadline = ?, heartbeat_at = ?, load = ?, "
            "claim_attempts = ?, claims_won = ?, tasks_done = ?, metrics = ? WHERE id = ?",
            (
                now + ttl,
                now,
                beat.load,
                beat.claim_attempts,
                beat.claims_won,
                beat.tasks_done,
                json.dumps(dict(beat.metrics)),
                expert,
            ),
        )
        rows = conn.execute(
            "UPDATE tasks SET lease_deadline = ? WHERE owner = ? "
            "AND state IN ('claimed', 'running') AND lease_deadline >= ? RETURNING id, fence",
            (now + ttl, expert, now),
        ).fetchall()
        return dict(rows)

    return await db.tx(run)


async def deregister_expert(db: Database, expert: str, session: str) -> None:
    def run(conn: sqlite3.Connection) -> None:
        now = db.clock()
        conn.execute(
            "UPDATE experts SET lease_deadline = min(lease_deadline, ?), load = 0 "
            "WHERE id = ? AND session = ?",
            (now - 1e-6, expert, session),
        )

    await db.tx(run)
