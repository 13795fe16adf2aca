"""The claim path: peek (what an expert could claim, for the race), claim, and steal.

A claim or a steal is one statement, atomic on its own: the session check (holding the expert
row shared, so that it cannot be replaced meanwhile), the pick ``FOR UPDATE SKIP LOCKED`` (two
claimers never wait on each other and never take the same task), the update and the history
event. Requirements are filtered in SQL (:data:`~contend.store.postgres.rows.FITS`), and so
is the auctions' order (:data:`~contend.store.postgres.auctions.NOT_HELD`): a task whose
auction holds the expert back is not claimable by it, in every pick below. That check reads
the statement's snapshot, which is enough because bids land only before an auction's close
and nobody may claim before it: from the close on, the ranking is final. (A bid checked just
before the close commits one round trip later; until then it holds the task shared, so
claims skip the task, but a claim whose snapshot is older than that commit ranks without
it.) A peek shows held-back tasks too, so that bidders see their lots.

The low-priority lane (``low_lane`` of the limit, see ``Store.claim``) goes to the tasks due
the longest among those below the top base priority. Those are not at the front of any one
index walk: behind a flood of urgent tasks due earlier, a walk by ``run_at`` would read the
whole flood. So the lane finds each queue's base priorities by a skip scan of ``tasks_lane``
(one index probe per level, at most :data:`~contend.domain.task.LANE_LEVELS` below the
queue's top), takes each level's first ``low_lane`` claimable tasks by (run_at, id), and
keeps the oldest of those below the highest level that had any. The best by effective
priority fill the rest of the limit."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from contend.domain import transitions as rules
from contend.domain.scoring import TaskView
from contend.domain.task import LANE_LEVELS, Capabilities, Requirements
from contend.store._common import check_limit, check_ttl
from contend.store.port import Claimed
from contend.store.postgres import floors
from contend.store.postgres.apply import handover
from contend.store.postgres.auctions import NOT_HELD
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.limited import BEST, Limited, live_cte, take_ctes
from contend.store.postgres.limits import (
    KEY_STATES,
    PICK_COLUMNS,
    THROTTLED,
    fair_params,
    fair_picks,
    fair_sql,
    has_fair,
    in_fair_order,
    key_states,
)
from contend.store.postgres.rows import CLAIMED_COLUMNS, FITS, NOT_CLAIMED, caps, claimed
from contend.store.postgres.sessions import check_session

log = logging.getLogger("contend.store.postgres")

#: A task with a limit key has room while fewer than its limit of that key's tasks are claimed
#: or running (``contend.domain.limits.admit``), counted on ``tasks_limited`` and no further
#: than the limit, and while its key's rate has room (:data:`~.limits.THROTTLED`). Read in the
#: statement's snapshot: a hint that keeps full keys out of the walk; the count and the room
#: a claim relies on are read under the key's lock (:class:`_Limited`).
ROOM = (
    "(t.limit_key IS NULL OR ((t.limit_max IS NULL OR (SELECT count(*) FROM (SELECT 1"
    " FROM {s}.tasks h WHERE h.limit_key = t.limit_key AND h.state IN ('claimed', 'running')"
    f" LIMIT t.limit_max) n) < t.limit_max) AND NOT {THROTTLED}))"
)


def _claimable(
    *,
    lock: bool,
    only_ids: bool,
    typed: bool,
    ordered: bool,
    mine: bool = False,
    plain: bool = False,
) -> str:
    """The condition on a task ``t`` (its queue aside) that it is claimable; with *lock*, only
    while the ``live`` CTE has the session; with *ordered*, only when no auction holds
    ``%(expert)s`` back from it (a claim; a peek shows bidders their lots). A claim (*lock*)
    also leaves out the tasks whose limit key has no room (:data:`ROOM`); a peek, as the
    other stores' peeks, shows them. Central tasks are left out (``NOT t.central``, which
    lets the planner use the claim order's partial indexes), unless *mine*: then only the
    central tasks a leader gave ``%(expert)s`` (``tasks_central``). *plain*: the lean claim's
    condition (see :func:`claim`), without the limits' room and the auctions' order, and only
    while the ``plain`` CTE says the store uses neither."""
    central = "t.central AND t.assignee = %(expert)s" if mine else "NOT t.central"
    return (
        ("EXISTS (SELECT 1 FROM live) AND " if lock else "")
        + ("(SELECT ok FROM plain) AND " if plain else "")
        + f"t.state = 'pending' AND {central} AND t.run_at <= {{now}} "
        + ("AND t.id = ANY(%(ids)s) " if only_ids else "")
        + ("AND t.type = ANY(%(types)s) " if typed else "")
        + f"AND {FITS}"
        + (f" AND {ROOM}" if lock and not plain else "")
        + (f" AND {NOT_HELD}" if ordered and not plain else "")
    )


def _level_below(cond: str) -> str:
    """One step of the skip scan: the highest priority of queue ``l.queue``'s pending tasks
    that meets *cond* (one probe of ``tasks_lane``)."""
    return (
        "(SELECT t.priority FROM {s}.tasks t WHERE t.state = 'pending' AND NOT t.central"
        f" AND t.queue = l.queue AND {NOT_CLAIMED.format(t='t.')}"
        f" {cond} ORDER BY t.priority DESC LIMIT 1)"
    )


#: Whether a task of a priority other than 0 was ever submitted (migration 13). If not, every
#: task is at one base priority, the low lane has nothing below the top to take, and its skip
#: scan is left out: behind a transaction that holds vacuum back, each probe of a level
#: walked the entries of every task claimed since (sustained 1,000 tasks/s fell behind for
#: good once claims came back full and took a lane slot). Housekeeping's ageing writes
#: nothing either (``housekeeping.age``).
SOME_LEVELS = "EXISTS (SELECT 1 FROM {s}.features WHERE name = 'levels')"


def _lane(
    *, lock: bool, only_ids: bool, typed: bool, central: bool = False, plain: bool = False
) -> str:
    """CTE ``lane``: up to ``%(lane)s`` claimable tasks, those due the longest among the ones
    whose base priority is below the highest of the claimable tasks; with *central*, no more
    than the ``mine`` CTE left of ``%(limit)s`` (:data:`LEFT`).

    Named tasks (*only_ids*) are few and found by primary key: the lane is one pick among
    them. Otherwise ``levels`` is the skip scan (for each queue of ``%(queues)s``, its top
    pending priority and then each next lower one, ``%(levels)s`` levels at most) and
    ``heads`` each level's first ``%(lane)s`` claimable tasks, walked in ``tasks_lane``
    order; they are locked there, where they are limited (a task a concurrent claimer holds
    is skipped, and the next one of its level takes its place).

    The level is bounded by ``>=`` and ``<=``, not ``=``, and ordered by the index's own
    columns: with ``priority = level`` both indexes give (run_at, id) order, the planner
    costs them alike and may walk ``tasks_oldest`` instead, through every task of the
    levels above (18 ms behind a flood of 100,000). A range leaves ``tasks_lane`` the only
    index in that order. Its price: ``run_at <= now`` no longer ends the walk of a level, so
    a level with fewer than ``%(lane)s`` due tasks is read to its end (index entries only)."""
    tail = " FOR UPDATE SKIP LOCKED" if lock else ""
    where = _claimable(lock=lock, only_ids=only_ids, typed=typed, ordered=lock, plain=plain)
    most = f"least(%(lane)s, {LEFT})" if central else "%(lane)s"
    if only_ids:
        return (
            "named AS (SELECT t.priority FROM {s}.tasks t"
            f"  WHERE {_claimable(lock=False, only_ids=True, typed=typed, ordered=lock, plain=plain)}"
            "  AND t.queue = ANY(%(queues)s)),"
            " lane AS (SELECT t.id, t.limit_key, t.limit_max FROM {s}.tasks t"
            f"  WHERE {where} AND t.queue = ANY(%(queues)s)"
            "  AND t.priority < (SELECT max(priority) FROM named)"
            f"  ORDER BY t.run_at, t.id LIMIT {most}{tail})"
        )
    return (
        "levels (queue, priority, depth) AS ("
        f"  SELECT l.queue, {_level_below('')}, 1 FROM unnest(%(queues)s::text[]) AS l(queue)"
        f"  WHERE {SOME_LEVELS}"
        "  UNION ALL"
        f"  SELECT l.queue, {_level_below('AND t.priority < l.priority')}, l.depth + 1"
        "   FROM levels l WHERE l.priority IS NOT NULL AND l.depth < %(levels)s"
        "), heads AS ("
        "  SELECT h.* FROM levels l CROSS JOIN LATERAL ("
        "   SELECT t.id, t.priority, t.run_at, t.limit_key, t.limit_max FROM {s}.tasks t"
        f"   WHERE {where} AND t.queue = l.queue AND {NOT_CLAIMED.format(t='t.')}"
        "    AND t.priority >= l.priority AND t.priority <= l.priority"
        f"   ORDER BY t.priority DESC, t.run_at, t.id LIMIT %(lane)s{tail}) h"
        "  WHERE l.priority IS NOT NULL"
        "), lane AS ("
        "  SELECT id, limit_key, limit_max FROM heads"
        "  WHERE priority < (SELECT max(priority) FROM heads)"
        f"  ORDER BY run_at, id LIMIT {most})"
    )


#: What the assigned central tasks (the ``mine`` CTE) leave of a claim's ``%(limit)s``.
LEFT = "%(limit)s - (SELECT count(*) FROM mine)"


def _mine(*, queues: int, only_ids: bool, typed: bool) -> str:
    """CTEs ending in ``mine``: the best ``%(limit)s`` claimable central tasks a leader gave
    ``%(expert)s``, locked: one arm per queue, each a seek on ``tasks_central``'s (queue,
    assignee) that reads the few tasks given to it, never a central queue's backlog.

    An arm names its queue (``q0``, ``q1``, …) and orders by the index's own columns: with
    ``queue = ANY(array)``, or before the table's statistics have seen a large submit, the
    planner walks ``tasks_oldest`` instead and filters every pending task of the queues
    (35-50 ms behind 100,000 central tasks)."""
    where = _claimable(lock=True, only_ids=only_ids, typed=typed, ordered=True, mine=True)
    ctes, arms = [], []
    for n in range(queues):
        ctes.append(
            f"mine_{n} AS (SELECT t.id, t.eff_priority, t.run_at, t.limit_key, t.limit_max"
            f" FROM {{s}}.tasks t WHERE {where} AND t.queue = %(q{n})s"
            f" ORDER BY t.assignee, {BEST} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
        )
        arms.append(f"SELECT * FROM mine_{n}")
    ctes.append(
        f"mine AS (SELECT id, limit_key, limit_max FROM ({' UNION ALL '.join(arms)}) u"
        f" ORDER BY {BEST} LIMIT %(limit)s)"
    )
    return ", ".join(ctes)


def _candidates(
    *,
    lock: bool,
    queues: int,
    lane: bool,
    only_ids: bool = False,
    typed: bool = False,
    plain: bool = False,
    floored: bool = False,
) -> str:
    """CTEs ending in ``picked``: the ids to take. A claim (*lock*) takes first the central
    tasks given to the claimer (:func:`_mine`). Then with *lane*, the ``lane`` (see
    :func:`_lane`) and then the best of the rest by effective priority, as many as the
    ``%(limit)s`` leaves; without, the best ``%(limit)s``. With *lock*, each pick takes its
    rows ``FOR UPDATE SKIP LOCKED`` (a claim; the rows must be locked where they are
    limited, or a concurrent claimer's rows would use up the limit), and only while the
    ``live`` CTE has the session.

    The best are picked by one arm per queue (parameters ``q0``, ``q1``, …): with ``queue =
    ANY(array)`` the planner cannot walk ``tasks_claimable`` in claim order and sorts every
    pending task instead. With *typed*, only tasks whose type is in ``%(types)s``. With
    *plain* (a claim's lean statement), no central tasks and the lean condition. With
    *floored*, each queue's top level is sought from its floor (:mod:`.floors`)."""
    tail = " FOR UPDATE SKIP LOCKED" if lock else ""
    where = _claimable(lock=lock, only_ids=only_ids, typed=typed, ordered=lock, plain=plain)
    mine = lock and not plain
    limit = LEFT if mine else "%(limit)s"
    ctes = [_mine(queues=queues, only_ids=only_ids, typed=typed)] if mine else []
    if lane:
        ctes.append(_lane(lock=lock, only_ids=only_ids, typed=typed, central=mine, plain=plain))
        where += " AND t.id <> ALL(ARRAY(SELECT id FROM lane))"
        limit = f"{limit} - (SELECT count(*) FROM lane)"
    arms = []
    columns = "t.id, t.eff_priority, t.run_at, t.limit_key, t.limit_max"
    for n in range(queues):
        if floored:
            ctes.extend(floors.arms(n, columns, where, limit, tail))
        else:
            ctes.append(
                f"best_{n} AS (SELECT {columns} FROM {{s}}.tasks t"
                f" WHERE {where} AND t.queue = %(q{n})s ORDER BY {BEST} LIMIT {limit}{tail})"
            )
        arms.append(f"SELECT * FROM best_{n}")
    ctes.append(
        f"best AS (SELECT id, limit_key, limit_max FROM ({' UNION ALL '.join(arms)}) u"
        f" ORDER BY {BEST} LIMIT {limit})"
    )
    union = " UNION ALL SELECT id, limit_key, limit_max FROM lane" if lane else ""
    if mine:
        union += " UNION ALL SELECT id, limit_key, limit_max FROM mine"
    ctes.append(f"picked AS (SELECT id, limit_key, limit_max FROM best{union})")
    return ", ".join(ctes)


VIEW_COLUMNS = "t.id, t.type, t.queue, t.priority, t.requirements, t.created_at"


def _types(types: Collection[str] | None) -> list[str] | None:
    return None if types is None else list(dict.fromkeys(types))


def _queues(queues: Sequence[str]) -> dict[str, object]:
    distinct = list(dict.fromkeys(queues))
    return {"queues": distinct, **{f"q{n}": q for n, q in enumerate(distinct)}}


async def peek(
    db: Database,
    queues: Sequence[str],
    capabilities: Capabilities,
    limit: int,
    *,
    low_lane: int = 0,
    types: Collection[str] | None = None,
) -> list[TaskView]:
    """One statement, which also says whether the queues hold fair tasks; if they do, the
    fair pick of a claim (without its locks, and leaving the rotation where it is) gives
    the order instead."""
    check_limit(limit)
    kinds = _types(types)
    if not queues or not limit or kinds == []:
        return []
    lane = min(check_limit(low_lane), limit)
    n_queues = len(set(queues))
    typed = kinds is not None

    def build() -> str:
        candidates = _candidates(lock=False, queues=n_queues, lane=lane > 0, typed=typed)
        return db.sql(
            f"WITH RECURSIVE {candidates} SELECT {VIEW_COLUMNS}, {has_fair(False, n_queues)}"
            f" FROM {{s}}.tasks t JOIN picked USING (id) ORDER BY {BEST}"
        )

    sql = db.text(("peek", n_queues, lane > 0, typed), build)
    params = {
        **_queues(queues),
        "limit": limit,
        "lane": lane,
        "levels": LANE_LEVELS + 1,
        "types": kinds,
        **caps(capabilities),
    }

    def build_fair() -> str:
        where = _claimable(lock=False, only_ids=False, typed=typed, ordered=False)
        ctes, query = fair_sql(where, queues=n_queues, named=False, lane=lane > 0, lock=False)
        head = f"{_lane(lock=False, only_ids=False, typed=typed)}, " if lane else ""
        return db.sql(f"WITH RECURSIVE {head}{ctes} {query}")

    async def run(cur: Cursor) -> list[TaskView]:
        await cur.execute(sql, db.params(**params))
        rows = await cur.fetchall()
        if rows and rows[0][-1]:  # fair tasks: the claim's fair order
            fair = db.text(("peek-fair", n_queues, lane > 0, typed), build_fair)
            views = db.sql(f"SELECT {VIEW_COLUMNS} FROM {{s}}.tasks t WHERE t.id = ANY(%(ids)s)")
            states = db.sql(KEY_STATES)
            cursor = dict(db.fair_cursor)
            await cur.execute(fair, db.params(**params, **fair_params(queues, cursor, limit)))
            first, rest = fair_picks(await cur.fetchall(), cursor, queues)
            keys = sorted({p.fair_key for p in rest if p.fair_key is not None})
            await cur.execute(states, db.params(keys=keys))
            held = key_states(await cur.fetchall())[0]
            order = [p.id for p in [*first, *in_fair_order(rest, held)]][:limit]
            await cur.execute(views, {"ids": order})
            by_id = {r[0]: r for r in await cur.fetchall()}
            rows = [by_id[i] for i in order if i in by_id]
        return [TaskView(r[0], r[1], r[2], r[3], Requirements.from_json(r[4]), r[5]) for r in rows]

    return await db.run(run, tx=False)


#: CTE ``plain``: whether the store never used a feature that the lean claim leaves out
#: (central queues, limit keys, fair share, auctions: the ``features`` table, migration 12;
#: its ``levels`` row is the low lane's, see SOME_LEVELS).
#: A sequential read of a table of at most four rows: no index to open.
PLAIN = "plain AS (SELECT NOT EXISTS (SELECT 1 FROM {s}.features WHERE name <> 'levels') AS ok)"

#: CLAIMED_COLUMNS' place in the row that tells a claim it met limit keys or fair tasks.
_NO_TASK = ", ".join(["NULL"] * (CLAIMED_COLUMNS.count(",") + 1))


class _Claim(NamedTuple):
    """What a claim's statements depend on besides the parameters (the key of their text)."""

    queues: int  # how many distinct queues
    lane: bool
    named: bool  # of named task ids
    typed: bool  # of some task types only
    assign: str  # the update's SET list, as the domain decided the claim
    line: str  # its history line

    def pick(self, lane: bool) -> str:
        return _candidates(
            lock=True, queues=self.queues, lane=lane, only_ids=self.named, typed=self.typed
        )

    def whole(self) -> str:
        """The whole statement: it takes nothing where limit keys or fair tasks were picked,
        and names them instead."""
        slow = " AND NOT (SELECT keyed FROM keyed) AND NOT (SELECT fair FROM fair)"
        take = take_ctes(slow) % {"assign": self.assign, "line": self.line}
        return (
            f"WITH RECURSIVE {live_cte()}, {self.pick(self.lane)}"
            ", keyed AS (SELECT count(*) > 0 AS keyed, array_agg(DISTINCT p.limit_key) FILTER ("
            "   WHERE p.limit_max IS NOT NULL"
            "    OR EXISTS (SELECT 1 FROM {s}.rate_keys r WHERE r.key = p.limit_key)) AS keys"
            "  FROM picked p WHERE p.limit_key IS NOT NULL)"
            f", fair AS (SELECT {has_fair(self.named, self.queues)}"
            " AND EXISTS (SELECT 1 FROM picked) AS fair)"
            f", {take}"
            " SELECT *, NULL::text[], NULL::boolean FROM claimed"
            f" UNION ALL SELECT {_NO_TASK}, keys, fair FROM keyed, fair WHERE keyed OR fair"
            f" ORDER BY {BEST}"
        )

    def lean(self, floored: bool) -> str:
        """The lean statement (see :func:`claim`); *floored*: each queue's walk starts at its
        floor (:mod:`.floors`)."""
        candidates = _candidates(
            lock=True,
            queues=self.queues,
            lane=self.lane,
            only_ids=self.named,
            typed=self.typed,
            plain=True,
            floored=floored,
        )
        return (
            f"WITH RECURSIVE {live_cte()}, {PLAIN}, {candidates}"
            f", {take_ctes('') % {'assign': self.assign, 'line': self.line}}"
            " SELECT *, NULL::text[], NULL::boolean FROM claimed"
            f" UNION ALL SELECT {_NO_TASK}, NULL::text[], NULL::boolean FROM plain WHERE NOT ok"
            f" ORDER BY {BEST}"
        )

    def picks(self, fair: bool) -> str:
        """The pick of a claim made again under its keys' locks (:class:`~.limited.Limited`),
        in fair order where there are fair tasks."""
        if not fair:
            return (
                f"WITH RECURSIVE {live_cte(True)}, {self.pick(False)}"
                " SELECT CASE WHEN t.central THEN 'mine' ELSE 'best' END,"
                f" {PICK_COLUMNS} FROM picked JOIN {{s}}.tasks t USING (id)"
                " ORDER BY t.central DESC, t.eff_priority DESC, t.run_at, t.id"
            )
        named, typed = self.named, self.typed
        where = _claimable(lock=True, only_ids=named, typed=typed, ordered=True)
        ctes, query = fair_sql(where, queues=self.queues, named=named, lane=self.lane, lock=True)
        mine = _mine(queues=self.queues, only_ids=named, typed=typed)
        head = _lane(lock=True, only_ids=named, typed=typed, central=True) if self.lane else ""
        return (
            f"WITH RECURSIVE {live_cte(True)}, {mine}, {head}{', ' if head else ''}{ctes}"
            f" {query} UNION ALL SELECT 'mine', {PICK_COLUMNS} FROM mine JOIN {{s}}.tasks t"
            " USING (id)"
        )

    def again(self) -> str:
        """The update of a claim made again: the history line of a rate-limited claim bears
        the time its rate was spent at (Limited.claim), so that the starts it records keep
        the rate's spacing."""
        stamped = self.line.replace("{now}", "coalesce(%(decided_at)s::float8, {now})", 1)
        return take_ctes(" AND t.state = 'pending'", live=True) % {
            "assign": self.assign,
            "line": stamped,
        }


async def _lean(
    db: Database,
    cur: Cursor,
    shape: _Claim,
    params: dict[str, Any],
    shape_floors: floors.Shape | None,
    queues: list[str],
) -> list[Any] | None:
    """The lean statement's rows; None when a feature is in use (it took nothing). Its walks
    start at their floors when *shape_floors* says so.

    While the store has never used central queues, limit keys, fair share or auctions (the
    ``features`` table is empty), the lean statement serves claims: no assigned central tasks,
    no limits' room, no auctions' order, no probe for keys or fair tasks. Their subplans cost a
    claim even when they never run (the executor opens every index they name): 0.53 ms of
    server time for a one-task claim against 0.16 ms without. The lean statement reads the
    table in its own snapshot and takes nothing when a feature is in use; the store then uses
    the whole statement for good. The table is written in the same statement as the first
    task or bid that uses a feature, so no claim sees such a task without it."""
    began = floors.clock()
    heard = db.floors_heard
    at = None
    if db.use_floors and shape_floors and shape_floors.use(began, heard):
        at = shape_floors.floors
    sql = db.text(("lean", at is not None, *shape), lambda: db.sql(shape.lean(at is not None)))
    more = floors.params(at, queues) if at is not None else {}
    await cur.execute(sql, db.params(**params, **more))
    rows = await cur.fetchall()
    # decided on what this statement said, not on the flag, which a concurrent claim of this
    # instance may turn off while this one's answer is on its way
    if any(r[0] is None for r in rows):
        if db.lean:
            db.lean = False
            log.info(
                "PostgreSQL store %s uses limits, fair share, central queues or auctions:"
                " claims take the whole statement from now on",
                db.schema,
            )
        return None
    if shape_floors is not None:
        shape_floors.learn(rows, at is None, began, floors.clock())
    return rows


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
    """A claim is one statement while the tasks it picks have no limit key and its queues
    (its named tasks) no fair task. Otherwise that statement takes nothing and names the
    limited keys instead; the claim is then made again in a transaction, under those keys'
    locks and in fair order where there are fair tasks (:class:`~.limited.Limited`). A leaner
    statement serves stores that never used those features (:func:`_lean`)."""
    check_limit(limit)
    ttl = check_ttl(lease_ttl)
    ids = list(dict.fromkeys(task_ids)) if task_ids is not None else None
    kinds = _types(types)
    lane = min(check_limit(low_lane), limit)
    in_queues = _queues(queues)
    distinct: list[str] = in_queues["queues"]  # type: ignore[assignment]
    assign, line, decided = handover(rules.claimed(expert, start=start))
    shape = _Claim(
        max(1, len(distinct)), lane > 0, ids is not None, kinds is not None, assign, line
    )
    # floors (``.floors``): for a lean claim of the best, not of named tasks
    shape_floors = (
        db.floors.setdefault(floors.key(distinct, capabilities, kinds), floors.Shape())
        if ids is None and queues
        else None
    )
    params = {
        **in_queues,
        "ids": ids,
        "types": kinds,
        "limit": limit,
        "lane": lane,
        "levels": LANE_LEVELS + 1,
        "expert": expert,
        "session": session,
        "ttl": ttl,
        **decided,
        **caps(capabilities),
    }

    async def run(cur: Cursor) -> tuple[list[Claimed], tuple[list[str], bool] | None]:
        if not queues or not limit or (ids is not None and not ids) or kinds == []:
            await check_session(db, cur, expert, session)
            return [], None
        rows = await _lean(db, cur, shape, params, shape_floors, distinct) if db.lean else None
        if rows is None:
            await cur.execute(
                db.text(("claim", *shape), lambda: db.sql(shape.whole())), db.params(**params)
            )
            rows = await cur.fetchall()
        met = next(((r[-2] or [], bool(r[-1])) for r in rows if r[0] is None), None)
        if not rows:  # nothing claimable, or a session that is not live: which?
            await check_session(db, cur, expert, session)
        return [claimed(r[:-2]) for r in rows if r[0] is not None], met

    got, met = await db.run(run, tx=False)
    if met is None:
        return got
    keys, fair = met
    picks, named = shape.picks(fair), ids is not None
    again = Limited(db, picks, shape.again(), params, fair=fair, named=named, queues=queues)
    return await db.run(lambda cur: again.claim(cur, keys), tx=True)


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
        "   AND owner = %(victim)s AND state = 'claimed' AND NOT central"
        "   AND lease_deadline >= {now}"
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
