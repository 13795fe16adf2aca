"""Central queues on SQLite: leaderships, assignments under a term, and the leader's read.

The rules are ``contend.domain.dispatch``'s; each function here reads what they need and
applies their decision in the same write transaction (``BEGIN IMMEDIATE``), so no other
writer, in any process, comes between the check and the write."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from contend.domain import dispatch as rules
from contend.domain.scoring import TaskView
from contend.domain.task import Requirements
from contend.store._common import check_limit, check_ttl
from contend.store._sql import load
from contend.store.port import CentralBacklog
from contend.store.sqlite.connection import Database
from contend.store.sqlite.rows import insert_events
from contend.store.sqlite.sessions import check_session


def _leadership(
    conn: sqlite3.Connection, name: str, now: float
) -> tuple[rules.Leadership | None, bool]:
    """The leadership *name* as stored, and whether its holder's session is live now."""
    row = conn.execute(
        "SELECT l.holder, l.session, l.term, l.deadline, "
        "EXISTS (SELECT 1 FROM experts e WHERE e.id = l.holder AND e.session = l.session "
        "AND e.lease_deadline >= ?) FROM leaders l WHERE l.name = ?",
        (now, name),
    ).fetchone()
    if row is None:
        return None, False
    return rules.Leadership(name, row[0], row[1], row[2], row[3]), bool(row[4])


async def lead(db: Database, expert: str, session: str, name: str, ttl: float) -> int | None:
    ttl = check_ttl(ttl)

    def run(conn: sqlite3.Connection) -> int | None:
        now = db.clock()
        check_session(conn, expert, session, now)
        current, live = _leadership(conn, name, now)
        granted = rules.decide_lead(current, expert, session, now, ttl, holder_live=live)
        if granted is None:
            return None
        conn.execute(
            "INSERT INTO leaders (name, holder, session, term, deadline) VALUES (?,?,?,?,?) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
            "session = excluded.session, term = excluded.term, deadline = excluded.deadline",
            (name, expert, session, granted.term, granted.deadline),
        )
        return granted.term

    return await db.tx(run)


async def assign(
    db: Database,
    expert: str,
    session: str,
    name: str,
    term: int,
    assignments: Mapping[str, str],
) -> int:
    plan = dict(assignments)

    def run(conn: sqlite3.Connection) -> int:
        now = db.clock()
        current, live = _leadership(conn, name, now)
        refused = rules.assign_refusal(name, current, expert, session, term, now, holder_live=live)
        if refused is not None:
            raise refused
        if not plan:
            return 0
        landed: list[tuple[str, int, str]] = []
        for tid, who in plan.items():
            row = conn.execute(_GIVE, (who, tid, now)).fetchone()
            if row is not None:
                landed.append((tid, row[0], who))
        detail = rules.assigned_detail(expert, term)
        insert_events(
            conn, [(tid, now, rules.ASSIGNED, fence, who, detail) for tid, fence, who in landed]
        )
        return len(landed)

    return await db.tx(run)


#: Give one task to an expert: only a pending central task with no live assignee.
_GIVE = (
    "UPDATE tasks SET assignee = ? WHERE id = ? AND state = 'pending' AND central = 1 "
    "AND (assignee IS NULL OR NOT EXISTS (SELECT 1 FROM experts e "
    "WHERE e.id = tasks.assignee AND e.lease_deadline >= ?)) RETURNING fence"
)


async def central_backlog(
    db: Database, queues: Sequence[str], live: Collection[str], limit: int
) -> CentralBacklog:
    check_limit(limit)
    alive = sorted(set(live))
    qs = list(dict.fromkeys(queues))

    def run() -> CentralBacklog:
        now = db.clock()
        conn = db.conn
        if not qs:
            return CentralBacklog([], {})
        qmarks = ",".join("?" * len(qs))
        assigned = conn.execute(
            f"SELECT assignee, count(*) FROM tasks INDEXED BY tasks_central "
            f"WHERE state = 'pending' AND central = 1 AND queue IN ({qmarks}) "
            "AND assignee IS NOT NULL GROUP BY assignee",
            tuple(qs),
        ).fetchall()
        known = set(alive)
        gone = [who for who, _ in assigned if who not in known]
        rows: list[Any] = []
        cols = "id, type, queue, priority, requirements, created_at, eff_priority, run_at"
        for q in qs:
            rows += conn.execute(
                f"SELECT {cols} FROM tasks INDEXED BY tasks_central WHERE state = 'pending' "
                "AND central = 1 AND queue = ? AND assignee IS NULL AND run_at <= ? "
                "ORDER BY eff_priority DESC, run_at, id LIMIT ?",
                (q, now, limit),
            ).fetchall()
        if gone:
            marks = ",".join("?" * len(gone))
            rows += conn.execute(
                f"SELECT {cols} FROM tasks INDEXED BY tasks_central WHERE state = 'pending' "
                f"AND central = 1 AND queue IN ({qmarks}) AND assignee IN ({marks}) "
                "AND run_at <= ? ORDER BY eff_priority DESC, run_at, id LIMIT ?",
                (*qs, *gone, now, limit),
            ).fetchall()
        rows.sort(key=lambda r: (-r[6], r[7], r[0]))
        views = [
            TaskView(r[0], r[1], r[2], r[3], Requirements.from_json(load(r[4])), r[5])
            for r in rows[:limit]
        ]
        marks = ",".join("?" * len(alive))
        held = conn.execute(
            f"SELECT owner, count(*) FROM tasks INDEXED BY tasks_owned WHERE owner IN ({marks}) "
            "AND state IN ('claimed', 'running') GROUP BY owner",
            tuple(alive),
        ).fetchall()
        return CentralBacklog(views, {w: n for w, n in assigned if w in known}, dict(held))

    return await db.retry(run)
