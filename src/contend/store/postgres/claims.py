"""The claim path: peek (what an expert could claim, for the race), claim, and steal.

A claim or a steal is one statement, atomic on its own: the session check (holding the expert
row shared, so that it cannot be replaced meanwhile), the pick ``FOR UPDATE SKIP LOCKED`` (two
claimers never wait on each other and never take the same task), the update and the history
event. Requirements are filtered in SQL (:data:`~contend.store.postgres.rows.FITS`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from contend.domain import transitions as rules
from contend.domain.scoring import TaskView
from contend.domain.task import Capabilities, Requirements
from contend.store._common import check_limit, check_ttl
from contend.store.port import Claimed
from contend.store.postgres.apply import handover
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.rows import CLAIMED_COLUMNS, FITS, caps, claimed
from contend.store.postgres.sessions import check_session


def _candidates(*, lock: bool, queues: int, only_ids: bool = False, typed: bool = False) -> str:
    """CTEs ``best`` and ``oldest``: the claimable tasks by effective priority (``%(best)s``
    of them), and those due the longest (``%(lane)s``, the low-priority lane). With *lock*
    each takes its rows ``FOR UPDATE SKIP LOCKED`` (a claim; the rows must be locked where
    they are limited, or a concurrent claimer's rows would use up the limit), and only
    while the ``live`` CTE has the session.

    One arm per queue (parameters ``q0``, ``q1``, …): with ``queue = ANY(array)`` the
    planner cannot walk the index in claim order and sorts every pending task instead.
    With *typed*, only tasks whose type is in ``%(types)s``."""
    tail = " FOR UPDATE SKIP LOCKED" if lock else ""
    ctes = []
    for kind, order, limit in (
        ("best", "eff_priority DESC, run_at, id", "%(best)s"),
        ("oldest", "run_at, id", "%(lane)s"),
    ):
        arms = []
        for n in range(queues):
            where = (
                ("EXISTS (SELECT 1 FROM live) AND " if lock else "")
                + f"state = 'pending' AND queue = %(q{n})s AND run_at <= {{now}} "
                + ("AND id = ANY(%(ids)s) " if only_ids else "")
                + ("AND type = ANY(%(types)s) " if typed else "")
                + f"AND {FITS}"
            )
            ctes.append(
                f"{kind}_{n} AS (SELECT id, eff_priority, run_at FROM {{s}}.tasks"
                f" WHERE {where} ORDER BY {order} LIMIT {limit}{tail})"
            )
            arms.append(f"SELECT * FROM {kind}_{n}")
        ctes.append(
            f"{kind} AS (SELECT id FROM ({' UNION ALL '.join(arms)}) u"
            f" ORDER BY {order} LIMIT {limit})"
        )
    ctes.append("picked AS (SELECT id FROM best UNION SELECT id FROM oldest)")
    return ", ".join(ctes)


def _types(types: Collection[str] | None) -> list[str] | None:
    return None if types is None else list(dict.fromkeys(types))


def _queues(queues: Sequence[str]) -> dict[str, str]:
    return {f"q{n}": q for n, q in enumerate(dict.fromkeys(queues))}


async def peek(
    db: Database,
    queues: Sequence[str],
    capabilities: Capabilities,
    limit: int,
    *,
    low_lane: int = 0,
    types: Collection[str] | None = None,
) -> list[TaskView]:
    check_limit(limit)
    kinds = _types(types)
    if not queues or not limit or kinds == []:
        return []
    lane = min(check_limit(low_lane), limit)
    candidates = _candidates(lock=False, queues=len(set(queues)), typed=kinds is not None)
    sql = db.sql(
        f"WITH {candidates}"
        " SELECT t.id, t.type, t.queue, t.priority, t.requirements, t.created_at"
        " FROM {s}.tasks t JOIN picked USING (id)"
        " ORDER BY t.eff_priority DESC, t.run_at, t.id"
    )

    async def run(cur: Cursor) -> list[TaskView]:
        await cur.execute(
            sql,
            db.params(
                **_queues(queues),
                best=limit - lane,
                lane=lane,
                types=kinds,
                **caps(capabilities),
            ),
        )
        return [
            TaskView(r[0], r[1], r[2], r[3], Requirements.from_json(r[4]), r[5])
            for r in await cur.fetchall()
        ]

    return await db.run(run, tx=False)


async def claim(
    db: Database,
    expert: str,
    session: str,
    queues: Sequence[str],
    capabilities: Capabilities,
    *,
    limit: int,
    lease_ttl: float,
    task_ids: Sequence[str] | None = None,
    start: bool = True,
    low_lane: int = 0,
    types: Collection[str] | None = None,
) -> list[Claimed]:
    check_limit(limit)
    ttl = check_ttl(lease_ttl)
    ids = list(dict.fromkeys(task_ids)) if task_ids is not None else None
    kinds = _types(types)
    # named tasks: the best of them, no low lane
    lane = min(check_limit(low_lane), limit) if ids is None else 0
    order = "eff_priority DESC, run_at, id"
    candidates = _candidates(
        lock=True,
        queues=max(1, len(set(queues))),
        only_ids=ids is not None,
        typed=kinds is not None,
    )
    assign, line, decided = handover(rules.claimed(expert, start=start))
    sql = db.sql(
        "WITH live AS ("
        "  SELECT 1 FROM {s}.experts WHERE id = %(expert)s AND session = %(session)s"
        "   AND lease_deadline >= {now} FOR SHARE"
        f"), {candidates}"
        ", claimed AS ("
        f"  UPDATE {{s}}.tasks t SET {assign}, owner = %(expert)s, fence = t.fence + 1,"
        "   lease_deadline = {now} + %(ttl)s, updated_at = {now}"
        "  FROM picked WHERE t.id = picked.id"
        f"  RETURNING {CLAIMED_COLUMNS}"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
        f"  SELECT {line} FROM claimed"
        f") SELECT * FROM claimed ORDER BY {order}"
    )

    async def run(cur: Cursor) -> list[Claimed]:
        if not queues or not limit or (ids is not None and not ids) or kinds == []:
            await check_session(db, cur, expert, session)
            return []
        await cur.execute(
            sql,
            db.params(
                **_queues(queues),
                ids=ids,
                types=kinds,
                best=limit - lane,
                lane=lane,
                expert=expert,
                session=session,
                ttl=ttl,
                **decided,
                **caps(capabilities),
            ),
        )
        rows = await cur.fetchall()
        if not rows:  # nothing claimable, or a session that is not live: which?
            await check_session(db, cur, expert, session)
        return [claimed(r) for r in rows]

    return await db.run(run, tx=False)


async def steal(
    db: Database,
    thief: str,
    session: str,
    victim: str,
    queues: Sequence[str],
    capabilities: Capabilities,
    *,
    limit: int,
    lease_ttl: float,
    types: Collection[str] | None = None,
) -> list[Claimed]:
    check_limit(limit)
    ttl = check_ttl(lease_ttl)
    kinds = _types(types)
    typed = "" if kinds is None else " AND type = ANY(%(types)s)"
    assign, line, decided = handover(rules.stolen(thief, victim))
    sql = db.sql(
        "WITH live AS ("
        "  SELECT 1 FROM {s}.experts WHERE id = %(thief)s AND session = %(session)s"
        "   AND lease_deadline >= {now} FOR SHARE"
        "), loot AS ("
        "  SELECT id FROM {s}.tasks"
        "  WHERE EXISTS (SELECT 1 FROM live)"
        "   AND owner = %(victim)s AND state = 'claimed' AND lease_deadline >= {now}"
        f"   AND queue = ANY(%(queues)s){typed} AND {FITS}"
        "  ORDER BY eff_priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
        "), stolen AS ("
        # a fenced transfer: the victim's start() of these is refused
        f"  UPDATE {{s}}.tasks t SET {assign}, owner = %(thief)s,"
        "   fence = t.fence + 1, lease_deadline = {now} + %(ttl)s, updated_at = {now}"
        "  FROM loot WHERE t.id = loot.id"
        f"  RETURNING {CLAIMED_COLUMNS}"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
        f"  SELECT {line} FROM stolen"
        ") SELECT * FROM stolen ORDER BY eff_priority DESC, run_at, id"
    )

    async def run(cur: Cursor) -> list[Claimed]:
        if not queues or not limit or kinds == []:
            await check_session(db, cur, thief, session)
            return []
        await cur.execute(
            sql,
            db.params(
                thief=thief,
                types=kinds,
                session=session,
                victim=victim,
                queues=list(queues),
                limit=limit,
                ttl=ttl,
                **decided,
                **caps(capabilities),
            ),
        )
        rows = await cur.fetchall()
        if not rows:
            await check_session(db, cur, thief, session)
        return [claimed(r) for r in rows]

    return await db.run(run, tx=False)
