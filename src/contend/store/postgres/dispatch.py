"""Central queues on PostgreSQL: leaderships, assignments under a term, and the leader's read.

The rules are ``contend.domain.dispatch``'s; this module reads what they need and writes their
decision with the leadership's row locked. ``lead`` holds the row ``FOR UPDATE`` from its read
to its commit; ``assign`` is one statement that holds it ``FOR SHARE`` while it compares the
holder, session, term and deadline (and the holder's session) and writes the assignees and
their history lines. A takeover waits for an assignment in flight to commit, and an
assignment that waited for a takeover reads the new term and is refused: no assignment of an
old term lands after the new term's first one. The statements read the time when they run
(``clock_timestamp()``), not when their transaction began: a lock waited for must not make a
lapsed leadership look held."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from contend.domain import dispatch as rules
from contend.domain.scoring import TaskView
from contend.domain.task import Requirements
from contend.store._common import check_limit, check_ttl, session_not_live
from contend.store.port import CentralBacklog
from contend.store.postgres.database import Cursor, Database, one
from contend.store.postgres.limited import BEST

#: Whether expert ``{who}`` is live in session ``{session}`` now.
_LIVE = (
    "EXISTS (SELECT 1 FROM {{s}}.experts e WHERE e.id = {who} AND e.session = {session}"
    " AND e.lease_deadline >= {{now}})"
)


async def lead(db: Database, expert: str, session: str, name: str, ttl: float) -> int | None:
    ttl = check_ttl(ttl)
    locked = db.sql(
        "SELECT holder, session, term, deadline FROM {s}.leaders WHERE name = %(name)s FOR UPDATE"
    )
    read = db.sql(
        "SELECT {now}, "
        + _LIVE.format(who="%(expert)s", session="%(session)s")
        + ", "
        + _LIVE.format(who="%(holder)s", session="%(holder_session)s"),
        live=True,
    )
    update = db.sql(
        "UPDATE {s}.leaders SET holder = %(expert)s, session = %(session)s, term = %(term)s,"
        " deadline = %(deadline)s WHERE name = %(name)s"
    )
    insert = db.sql(
        "INSERT INTO {s}.leaders (name, holder, session, term, deadline)"
        " VALUES (%(name)s, %(expert)s, %(session)s, %(term)s, %(deadline)s)"
        " ON CONFLICT (name) DO NOTHING RETURNING 1"
    )

    async def run(cur: Cursor) -> int | None:
        while True:
            await cur.execute(locked, {"name": name})
            row = await cur.fetchone()
            current = None if row is None else rules.Leadership(name, *row)
            holder = (None, None) if current is None else (current.holder, current.session)
            await cur.execute(
                read,
                db.params(
                    expert=expert, session=session, holder=holder[0], holder_session=holder[1]
                ),
            )
            now, mine, live = one(await cur.fetchone())
            if not mine:
                raise session_not_live(expert, session)
            granted = rules.decide_lead(current, expert, session, now, ttl, holder_live=live)
            if granted is None:
                return None
            values = {
                "name": name,
                "expert": expert,
                "session": session,
                "term": granted.term,
                "deadline": granted.deadline,
            }
            if current is not None:
                await cur.execute(update, values)
                return granted.term
            await cur.execute(insert, values)
            if await cur.fetchone() is not None:
                return granted.term
            # another expert made the row meanwhile (and committed): read it, locked, again

    return await db.run(run)


#: The assignment: the leadership read ``FOR SHARE`` with its holder's liveness and the time,
#: the plan applied only where the leadership holds (``ok``), to the tasks still pending and
#: central with no live assignee, and their history lines; one row back (none: no leadership).
_ASSIGN = (
    "WITH ldr AS ("
    "  SELECT holder, session, term, deadline FROM {s}.leaders WHERE name = %(name)s FOR SHARE"
    "), cur AS ("
    "  SELECT l.*, "
    + _LIVE.format(who="l.holder", session="l.session")
    + " AS live, {now} AS now FROM ldr l"
    "), ok AS ("
    "  SELECT 1 FROM cur WHERE live AND holder = %(expert)s AND session = %(session)s"
    "   AND term = %(term)s AND deadline >= now"
    "), given AS ("
    "  UPDATE {s}.tasks t SET assignee = p.who"
    "  FROM unnest(%(ids)s::text[], %(whos)s::text[]) AS p(id, who)"
    "  WHERE EXISTS (SELECT 1 FROM ok) AND t.id = p.id AND t.state = 'pending' AND t.central"
    "   AND (t.assignee IS NULL OR NOT EXISTS (SELECT 1 FROM {s}.experts e"
    "    WHERE e.id = t.assignee AND e.lease_deadline >= {now}))"
    "  RETURNING t.id, t.fence, t.assignee"
    "), events AS ("
    "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
    "  SELECT id, {now}, %(event)s, fence, assignee, %(detail)s FROM given"
    ") SELECT holder, session, term, deadline, live, now, (SELECT count(*) FROM given) FROM cur"
)


async def assign(
    db: Database,
    expert: str,
    session: str,
    name: str,
    term: int,
    assignments: Mapping[str, str],
) -> int:
    plan = dict(assignments)
    sql = db.sql(_ASSIGN, live=True)
    params = {
        "name": name,
        "expert": expert,
        "session": session,
        "term": term,
        "ids": list(plan),
        "whos": list(plan.values()),
        "event": rules.ASSIGNED,
        "detail": rules.assigned_detail(expert, term),
    }

    async def run(cur: Cursor) -> int:
        await cur.execute(sql, db.params(**params))
        row = await cur.fetchone()
        current = None if row is None else rules.Leadership(name, *row[:4])
        live, now = (False, 0.0) if row is None else (bool(row[4]), float(row[5]))
        refused = rules.assign_refusal(name, current, expert, session, term, now, holder_live=live)
        if refused is not None:
            raise refused  # the statement wrote nothing; the rollback makes sure of it
        return 0 if row is None else int(row[6])

    return await db.run(run)


_VIEW = "t.id, t.type, t.queue, t.priority, t.requirements, t.created_at, t.eff_priority, t.run_at"

#: A pending central task of queue ``%(q{n})s``.
_CENTRAL = "t.state = 'pending' AND t.central AND t.queue = %(q{n})s"


def _need(queues: int) -> str:
    """The pending central tasks that need an assignee: each queue's best unassigned ones (a
    seek on ``tasks_central`` at assignee NULL) and the best of those given to an expert not
    in ``%(alive)s`` (the queue's assigned ones, read to their end).

    One arm per queue (``q0``, ``q1``, …), ordered by the index's own columns: with ``queue =
    ANY(array)``, or before the statistics have seen a large submit, the planner walks
    ``tasks_oldest`` and sorts the whole backlog instead (120-160 ms behind 100,000)."""
    arms = []
    for n in range(queues):
        central = _CENTRAL.format(n=n)
        arms.append(
            f"(SELECT {_VIEW} FROM {{s}}.tasks t WHERE {central} AND t.assignee IS NULL"
            "  AND t.run_at <= {now}"
            f"  ORDER BY t.assignee, {BEST} LIMIT %(limit)s)"
        )
        arms.append(
            f"(SELECT {_VIEW} FROM {{s}}.tasks t WHERE {central} AND t.assignee IS NOT NULL"
            "  AND t.assignee <> ALL(%(alive)s) AND t.run_at <= {now}"
            f"  ORDER BY t.assignee, {BEST} LIMIT %(limit)s)"
        )
    return " UNION ALL ".join(arms)


def _assigned(queues: int) -> str:
    """Each expert's pending central tasks given to it (read as :func:`_need` reads)."""
    arms = [
        f"SELECT t.assignee, count(*) FROM {{s}}.tasks t WHERE {_CENTRAL.format(n=n)}"
        " AND t.assignee IS NOT NULL GROUP BY t.assignee"
        for n in range(queues)
    ]
    return " UNION ALL ".join(arms)


#: Each live expert's claimed and running tasks (``tasks_owned``).
_HELD = (
    "SELECT owner, count(*) FROM {s}.tasks WHERE owner = ANY(%(alive)s)"
    " AND state IN ('claimed', 'running') GROUP BY owner"
)


async def central_backlog(
    db: Database, queues: Sequence[str], live: Collection[str], limit: int
) -> CentralBacklog:
    check_limit(limit)
    alive = sorted(set(live))
    qs = list(dict.fromkeys(queues))
    need, assigned = db.sql(_need(len(qs))), db.sql(_assigned(len(qs)))
    held = db.sql(_HELD)
    by_queue = {f"q{n}": q for n, q in enumerate(qs)}

    async def run(cur: Cursor) -> CentralBacklog:
        if not qs:
            return CentralBacklog([], {})
        params = db.params(alive=alive, limit=limit, **by_queue)
        await cur.execute(need, params)
        rows: list[Any] = sorted(await cur.fetchall(), key=lambda r: (-r[6], r[7], r[0]))
        views = [
            TaskView(r[0], r[1], r[2], r[3], Requirements.from_json(r[4]), r[5])
            for r in rows[:limit]
        ]
        await cur.execute(assigned, params)
        given: dict[str, int] = {}
        known = set(alive)
        for who, n in await cur.fetchall():
            if who in known:
                given[who] = given.get(who, 0) + int(n)
        await cur.execute(held, params)
        holds = {str(w): int(n) for w, n in await cur.fetchall()}
        return CentralBacklog(views, given, holds)

    return await db.run(run, tx=False)
