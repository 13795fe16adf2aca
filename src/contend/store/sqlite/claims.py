"""The claim path: peek at claimable tasks, claim them in one ``UPDATE … RETURNING``, and steal
claimed-but-unstarted tasks from an overloaded expert."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from typing import Any

from contend.domain import transitions as rules
from contend.domain.limits import FairCandidate, admit, fair_order, rooms
from contend.domain.scoring import TaskView
from contend.domain.task import LANE_LEVELS, MAX_PRIORITY, Capabilities, Requirements
from contend.store._common import check_limit, check_ttl
from contend.store._sql import load
from contend.store.port import Claimed
from contend.store.sqlite.auctions import held_back
from contend.store.sqlite.connection import Database
from contend.store.sqlite.limits import (
    fair_heads,
    has_fair,
    rate_states,
    spend_rates,
    throttled,
)
from contend.store.sqlite.outcomes import attempts_sql
from contend.store.sqlite.rows import claimed_from_row, insert_events
from contend.store.sqlite.sessions import check_session


def _where(
    queues: Sequence[str],
    with_ids: int | None,
    types: Collection[str] | None,
    without: int = 0,
    full: int = 0,
) -> str:
    """Claimable tasks (parameters: queues, now, [ids], [types], [ids held back], [limit
    keys at their limit])."""
    qmarks = ",".join("?" * len(queues))
    ids = f" AND id IN ({','.join('?' * with_ids)})" if with_ids is not None else ""
    of_type = f" AND type IN ({','.join('?' * len(types))})" if types is not None else ""
    held = f" AND id NOT IN ({','.join('?' * without)})" if without else ""
    keys = f" AND (limit_key IS NULL OR limit_key NOT IN ({','.join('?' * full)}))" if full else ""
    return (
        f"state = 'pending' AND central = 0 AND queue IN ({qmarks}) AND run_at <= ?"
        f"{ids}{of_type}{held}{keys} AND (requirements IS NULL OR contend_fits(requirements))"
    )


def _claimable_sql(
    queues: Sequence[str],
    with_ids: int | None,
    types: Collection[str] | None = None,
    lane: int = 0,
    without: int = 0,
    full: int = 0,
) -> str:
    """A predicate on claimable tasks: the best by effective priority (parameters: queues,
    now, [ids], [types], [*without* ids held back], [*full* limit keys], limit), and the
    *lane* ids the low lane chose (:func:`_lane`; parameters: their ids, then the limit of
    the best)."""
    where = _where(queues, with_ids, types, without, full)
    # INDEXED BY: left to itself the planner prefers the run_at range of tasks_oldest and
    # then sorts every pending task; walking the claim order's own index stops at LIMIT.
    # Named ids are looked up by key instead (the primary key's index, which SQLite names
    # after the table): walking the claim order's index to find them reads every task
    # ahead of them, and left to itself the planner ranges over tasks_oldest; either way
    # 25-50 ms behind 100,000 tasks of another fair key, against 0.1 ms by key
    index = (
        "INDEXED BY sqlite_autoindex_tasks_1"
        if with_ids is not None
        else "INDEXED BY tasks_claimable"
    )
    if not lane:
        return (
            f"id IN (SELECT id FROM tasks {index} WHERE {where} "
            "ORDER BY eff_priority DESC, run_at, id LIMIT ?)"
        )
    marks = ",".join("?" * lane)
    best = (
        f"SELECT id FROM tasks {index} WHERE id NOT IN ({marks}) AND {where} "
        "ORDER BY eff_priority DESC, run_at, id LIMIT ?"
    )
    # one IN over a compound query, so the outer statement looks ids up by key (an OR of
    # two INs would make SQLite scan the whole table)
    values = ",".join(["(?)"] * lane)
    return f"id IN (SELECT id FROM ({best}) UNION ALL SELECT column1 FROM (VALUES {values}))"


def _claimable_params(
    queues: Sequence[str],
    now: float,
    ids: Sequence[str] | None,
    types: Collection[str] | None,
    limit: int,
    lane: Sequence[str] = (),
    held: Sequence[str] = (),
    full: Sequence[str] = (),
) -> tuple[Any, ...]:
    """The parameters of :func:`_claimable_sql`, in its order."""
    kinds = tuple(types or ())
    where = (*queues, now, *(ids or ()), *kinds, *held, *full)
    if not lane:
        return (*where, limit)
    return (*lane, *where, limit - len(lane), *lane)


def _lane(
    conn: sqlite3.Connection,
    queues: Sequence[str],
    now: float,
    ids: Sequence[str] | None,
    types: Collection[str] | None,
    n: int,
    held: Sequence[str] = (),
    full: Sequence[str] = (),
) -> list[str]:
    """The low lane's choice: the *n* claimable tasks due the longest among those below the
    highest base priority of the claimable ones. The levels of each queue are found by
    stepping down its ``tasks_lane`` index (a skip scan, one seek a level), then each level's
    first *n* claimable by due time: a few seeks per level, however long the backlog."""
    if ids is not None:
        return _named_lane(conn, queues, now, ids, types, n, held, full)
    one = ["x"]
    where = _where(one, None, types, len(held), len(full))
    pick = (
        f"SELECT run_at, id, priority FROM tasks INDEXED BY tasks_lane "
        f"WHERE priority = ? AND {where} ORDER BY run_at, id LIMIT ?"
    )
    step = (
        "SELECT priority FROM tasks INDEXED BY tasks_lane WHERE state = 'pending' "
        "AND central = 0 AND queue = ? AND priority < ? ORDER BY priority DESC LIMIT 1"
    )
    extra = (*(types or ()), *held, *full)
    heads: list[tuple[float, str, int]] = []
    top: int | None = None
    for queue in dict.fromkeys(queues):
        level, below = MAX_PRIORITY + 1, 0
        # the top and LANE_LEVELS levels below it that have claimable tasks, stepping past
        # at most as many again that have none (not due, or not this expert's)
        for _ in range(2 * (LANE_LEVELS + 1)):
            if below > LANE_LEVELS:
                break
            row = conn.execute(step, (queue, level)).fetchone()
            if row is None:
                break
            level = row[0]
            got = conn.execute(pick, (level, queue, now, *extra, n)).fetchall()
            if got:
                heads += got
                top = level if top is None else max(top, level)
                below += 1
    if top is None:
        return []
    return [tid for _, tid, p in sorted(h for h in heads if h[2] < top)[:n]]


def _named_lane(
    conn: sqlite3.Connection,
    queues: Sequence[str],
    now: float,
    ids: Sequence[str],
    types: Collection[str] | None,
    n: int,
    held: Sequence[str],
    full: Sequence[str],
) -> list[str]:
    """The low lane among named ids (a race's): the same rule as :func:`_lane`, over just
    those tasks, read by key (walking the levels to find them would read every task of
    each level)."""
    where = _where(queues, len(ids), types, len(held), len(full))
    rows = conn.execute(
        f"SELECT run_at, id, priority, queue FROM tasks INDEXED BY sqlite_autoindex_tasks_1 "
        f"WHERE {where}",
        (*queues, now, *ids, *(types or ()), *held, *full),
    ).fetchall()
    if not rows:
        return []
    top = max(r[2] for r in rows)
    levels: dict[str, set[int]] = {}
    for r in rows:
        if r[2] < top:
            levels.setdefault(r[3], set()).add(r[2])
    kept = {q: set(sorted(ps, reverse=True)[:LANE_LEVELS]) for q, ps in levels.items()}
    lower = sorted((r[0], r[1]) for r in rows if r[2] in kept.get(r[3], ()))
    return [tid for _, tid in lower[:n]]


def _fair(
    db: Database,
    queues: Sequence[str],
    now: float,
    ids: Sequence[str] | None,
    types: Collection[str] | None,
    want: int,
    without: Sequence[str] = (),
    full: Sequence[str] = (),
) -> list[str] | None:
    """Where *queues* hold fair tasks, the *want* ids a claim takes, in fair order: each fair
    key's heads (:func:`~contend.store.sqlite.limits.fair_heads`) and the best of the tasks
    without a fair key (looked for among the best few, so that a long fair backlog costs no
    scan), ranked by ``contend.domain.limits.fair_order``. None: no fair task, plain order."""
    conn = db.conn
    if want <= 0 or not has_fair(conn, queues):
        return None
    n = None if ids is None else len(ids)
    extra = (now, *(ids or ()), *(types or ()), *without, *full)
    if ids is not None:
        # named ids (a race's): rank just those, read by key; walking each key's heads to
        # find them would read every task ahead of them
        rows = conn.execute(
            f"SELECT id, fair_key, priority, eff_priority, run_at FROM tasks "
            f"INDEXED BY sqlite_autoindex_tasks_1 WHERE "
            f"{_where(queues, n, types, len(without), len(full))} "
            "ORDER BY eff_priority DESC, run_at, id",
            (*queues, *extra),
        ).fetchall()
        if all(r[1] is None for r in rows):
            return None
        named = [FairCandidate(*r) for r in rows]
        return fair_order(named, _holders(conn, {c.key for c in named if c.key}), want)
    one = _where(["x"], n, types, len(without), len(full))
    heads = [
        h
        for queue in dict.fromkeys(queues)
        for h in fair_heads(conn, queue, one, extra, want, db.fair_cursor)
    ]
    where = _where(queues, n, types, len(without), len(full))
    heads += (
        FairCandidate(r[0], None, r[1], r[2], r[3])
        for r in conn.execute(
            f"SELECT id, priority, eff_priority, run_at FROM (SELECT id, fair_key, priority, "
            f"eff_priority, run_at FROM tasks INDEXED BY tasks_claimable WHERE {where} "
            "ORDER BY eff_priority DESC, run_at, id LIMIT ?) WHERE fair_key IS NULL",
            (*queues, *extra, want + 64),
        )
    )
    running = _holders(conn, {h.key for h in heads if h.key is not None})
    return fair_order(heads, running, want)


def _types(types: Collection[str] | None) -> list[str] | None:
    return None if types is None else list(dict.fromkeys(types))


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
    lane = min(low_lane, limit)
    now = db.clock()

    def run() -> list[TaskView]:
        db.caps = capabilities
        chosen = _lane(db.conn, queues, now, None, kinds, lane) if lane else []
        fair = _fair(db, queues, now, None, kinds, limit - len(chosen), chosen)
        n = None if fair is None else len(fair)
        inner = _claimable_sql(queues, n, kinds, len(chosen))
        params = _claimable_params(queues, now, fair, kinds, limit, chosen)
        rows = db.conn.execute(
            f"SELECT id, type, queue, priority, requirements, created_at FROM tasks "
            f"WHERE {inner} ORDER BY eff_priority DESC, run_at, id",
            params,
        ).fetchall()
        return [
            TaskView(r[0], r[1], r[2], r[3], Requirements.from_json(load(r[4])), r[5]) for r in rows
        ]

    return await db.retry(run)


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
    outcome = rules.claimed(expert, start=start)

    def run(conn: sqlite3.Connection) -> tuple[list[Any], float]:
        now = db.clock()
        check_session(conn, expert, session, now)
        if not queues or not limit or (ids is not None and not ids) or kinds == []:
            return [], now + ttl
        db.caps = capabilities
        held = held_back(conn, expert, now)  # the auctions' order, kept here
        update = (
            f"UPDATE tasks SET state = ?, owner = ?, fence = fence + 1"
            f"{attempts_sql(outcome.attempts)}, lease_deadline = ?, updated_at = ?, "
            "assignee = NULL WHERE "
        )
        head = (str(outcome.state), expert, now + ttl, now)
        # the central tasks a leader gave this expert go first
        mine = _assigned(conn, expert, queues, now, ids, kinds, held, limit)
        given = (
            conn.execute(
                update + f"id IN ({','.join('?' * len(mine))}) " + RETURNING, (*head, *mine)
            ).fetchall()
            if mine
            else []
        )
        _spend(conn, given, now)  # before the rest, which reads what room the keys have left
        rest = limit - len(given)
        rows = _claim_rest(conn, db, queues, now, ids, kinds, rest, low_lane, held, update, head)
        _spend(conn, rows, now)
        return _claimed(conn, outcome, given + rows, now), now + ttl

    return _received(*await db.tx(run))


def _spend(conn: sqlite3.Connection, rows: list[Any], now: float) -> None:
    """Spend a start of the rate of each rate-limited key among the claimed *rows*."""
    rates = rate_states(conn, {r[12] for r in rows})
    if rates:
        spend_rates(conn, rates, (r[12] for r in rows), now)


def _claim_rest(
    conn: sqlite3.Connection,
    db: Database,
    queues: Sequence[str],
    now: float,
    ids: Sequence[str] | None,
    kinds: Collection[str] | None,
    limit: int,
    low_lane: int,
    held: Sequence[str],
    update: str,
    head: tuple[Any, ...],
) -> list[Any]:
    """The claim's compete and fifo part, up to *limit*: the low lane's, the fair or best
    others, every limit kept; the rows it took (RETURNING)."""
    if limit <= 0:
        return []
    # limit keys at their concurrency limit, and rate keys with no room now
    full = list(dict.fromkeys([*_full_keys(conn), *throttled(conn, now)]))
    lane = (
        _lane(conn, queues, now, ids, kinds, min(low_lane, limit), held, full) if low_lane else []
    )
    fair = _fair(db, queues, now, ids, kinds, limit - len(lane), [*held, *lane], full)
    named = ids if fair is None else fair
    n = None if named is None else len(named)
    inner = _claimable_sql(queues, n, kinds, len(lane), len(held), len(full))
    params = _claimable_params(queues, now, named, kinds, limit, lane, held, full)
    conn.execute("SAVEPOINT contend_claim")
    rows = conn.execute(update + inner + RETURNING, (*head, *params)).fetchall()
    if any(r[12] is not None for r in rows) and (
        _over(conn, rows) or _over_rate(rows, rate_states(conn, {r[12] for r in rows}), now)
    ):
        # two of one key in this claim: take them again one key's room at a time
        conn.execute("ROLLBACK TO contend_claim")
        wide = limit * 8 + 64
        if fair is not None:  # the fair order further on, for the places a key refuses
            fair = _fair(db, queues, now, ids, kinds, wide, [*held, *lane], full) or []
            named = [*lane, *fair]
        where = _where(queues, None if named is None else len(named), kinds, len(held), len(full))
        by = "sqlite_autoindex_tasks_1" if named is not None else "tasks_claimable"
        picks = conn.execute(
            f"SELECT id, limit_key, limit_max FROM tasks INDEXED BY {by} "
            f"WHERE {where} ORDER BY eff_priority DESC, run_at, id LIMIT ?",
            (*queues, now, *(named or ()), *(kinds or ()), *held, *full, wide),
        ).fetchall()
        if lane or fair is not None:  # keep the lane's and the fair order
            first = {tid: i for i, tid in enumerate([*lane, *(fair or ())])}
            picks.sort(key=lambda p: first.get(p[0], len(first)))
        keys = {p[1] for p in picks if p[1]}
        chosen = admit(picks, _holders(conn, keys), limit, rooms(rate_states(conn, keys), now))
        rows = conn.execute(
            update + f"id IN ({','.join('?' * len(chosen))}) " + RETURNING, (*head, *chosen)
        ).fetchall()
    conn.execute("RELEASE contend_claim")
    return rows


def _claimed(
    conn: sqlite3.Connection, outcome: rules.Outcome, rows: list[Any], now: float
) -> list[Any]:
    """Write the claims' history lines; the claimed *rows*, for :func:`_received`."""
    event, actor, detail = str(outcome.event), outcome.actor, outcome.detail or ""
    insert_events(conn, [(r[0], now, event, r[5], actor, detail) for r in rows])
    return rows


def _received(rows: list[Any], deadline: float) -> list[Claimed]:
    """What the new owner receives from the ``RETURNING`` *rows* of a claim or a steal, in
    their order. Built after the transaction has committed: decoding the arguments of hundreds
    of tasks inside it held the write lock that every other expert of the file waits for."""
    return [claimed_from_row(r, deadline) for r in rows]


def _assigned(
    conn: sqlite3.Connection,
    expert: str,
    queues: Sequence[str],
    now: float,
    ids: Sequence[str] | None,
    kinds: Collection[str] | None,
    held: Sequence[str],
    limit: int,
) -> list[str]:
    """The central tasks a leader gave *expert* that it may claim now, in claim order, its
    concurrency limits kept (``tasks_central``: a seek on (queue, assignee), never a walk
    over a central queue's backlog)."""
    qmarks = ",".join("?" * len(queues))
    cond = "" if ids is None else f" AND id IN ({','.join('?' * len(ids))})"
    if kinds is not None:
        cond += f" AND type IN ({','.join('?' * len(kinds))})"
    if held:
        cond += f" AND id NOT IN ({','.join('?' * len(held))})"
    picks = conn.execute(
        f"SELECT id, limit_key, limit_max FROM tasks INDEXED BY tasks_central "
        f"WHERE state = 'pending' AND central = 1 AND queue IN ({qmarks}) AND assignee = ? "
        f"AND run_at <= ?{cond} AND (requirements IS NULL OR contend_fits(requirements)) "
        "ORDER BY eff_priority DESC, run_at, id LIMIT ?",
        (*queues, expert, now, *(ids or ()), *(kinds or ()), *held, limit * 8 + 64),
    ).fetchall()
    if not picks:
        return []
    keys = {p[1] for p in picks if p[1]}
    return admit(picks, _holders(conn, keys), limit, rooms(rate_states(conn, keys), now))


RETURNING = (
    "RETURNING id, type, queue, args, kwargs, fence, attempts, max_attempts, "
    "checkpoint, timeout, priority, trace, limit_key"
)


def _full_keys(conn: sqlite3.Connection) -> list[str]:
    """The limit keys whose claimed and running tasks already number their limit."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT limit_key FROM tasks INDEXED BY tasks_limited WHERE limit_key IS NOT NULL "
            "AND state IN ('claimed', 'running') GROUP BY limit_key "
            "HAVING count(*) >= min(limit_max)"
        )
    ]


def _holders(conn: sqlite3.Connection, keys: Collection[str]) -> dict[str, int]:
    """Limit key -> its claimed and running tasks."""
    if not keys:
        return {}
    marks = ",".join("?" * len(keys))
    return dict(
        conn.execute(
            f"SELECT limit_key, count(*) FROM tasks INDEXED BY tasks_limited "
            f"WHERE limit_key IN ({marks}) AND state IN ('claimed', 'running') "
            "GROUP BY limit_key",
            tuple(keys),
        ).fetchall()
    )


def _over_rate(
    rows: Sequence[tuple[Any, ...]], rates: dict[str, tuple[Any, float | None]], now: float
) -> bool:
    """Whether the claim just made took more of a rate key than its rate has room for."""
    if not rates:
        return False
    room = rooms(rates, now)
    taken: dict[str, int] = {}
    for r in rows:
        if r[12] in room:
            taken[r[12]] = taken.get(r[12], 0) + 1
    return any(n > room[k] for k, n in taken.items())


def _over(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> bool:
    """Whether the claim just made put a limit key over its limit."""
    keys = {r[12] for r in rows if r[12] is not None}
    marks = ",".join("?" * len(keys))
    return bool(
        conn.execute(
            f"SELECT 1 FROM tasks INDEXED BY tasks_limited WHERE limit_key IN ({marks}) "
            "AND state IN ('claimed', 'running') GROUP BY limit_key "
            "HAVING count(*) > min(limit_max) LIMIT 1",
            tuple(keys),
        ).fetchone()
    )


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
    if not queues or not limit or kinds == []:
        return []
    qmarks = ",".join("?" * len(queues))
    of_type = "" if kinds is None else f" AND type IN ({','.join('?' * len(kinds))})"
    outcome = rules.stolen(thief, victim)

    def run(conn: sqlite3.Connection) -> tuple[list[Any], float]:
        now = db.clock()
        check_session(conn, thief, session, now)
        db.caps = capabilities
        rows = conn.execute(
            f"UPDATE tasks SET state = ?, owner = ?, fence = fence + 1"
            f"{attempts_sql(outcome.attempts)}, lease_deadline = ?, updated_at = ? WHERE id IN ("
            f"SELECT id FROM tasks WHERE owner = ? AND state = 'claimed' AND central = 0 "
            f"AND lease_deadline >= ? AND queue IN ({qmarks}){of_type} "
            "AND (requirements IS NULL OR contend_fits(requirements)) "
            "ORDER BY eff_priority DESC, run_at, id LIMIT ?) "
            "RETURNING id, type, queue, args, kwargs, fence, attempts, max_attempts, "
            "checkpoint, timeout, priority, trace",
            (
                str(outcome.state),
                thief,
                now + ttl,
                now,
                victim,
                now,
                *queues,
                *(kinds or ()),
                limit,
            ),
        ).fetchall()
        event, actor, detail = str(outcome.event), outcome.actor, outcome.detail or ""
        insert_events(conn, [(r[0], now, event, r[5], actor, detail) for r in rows])
        rows.sort(key=lambda r: -r[10])  # RETURNING keeps no order: best first
        return rows, now + ttl

    return _received(*await db.tx(run))
