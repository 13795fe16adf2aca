"""Housekeeping, run by :meth:`PostgresStore.expire`: lapsed claims go back (or die on their
last attempt), pending tasks age, long-gone experts and finished auctions are deleted."""

from __future__ import annotations

from contend.domain import transitions as rules
from contend.domain.task import aged_priority, next_promotion
from contend.store.postgres.apply import LOCKED, Decided, apply
from contend.store.postgres.claims import SOME_LEVELS
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.dependants import settle_dependents


async def expire(db: Database) -> int:
    async def run(cur: Cursor) -> int:
        moved = await _return_lapsed(db, cur)
        await age(db, cur)  # after the lapse: returned tasks catch up on their ageing too
        await cur.execute(
            db.sql("DELETE FROM {s}.experts WHERE lease_deadline < {now} - 3600"), db.params()
        )
        # auctions and bids of tasks that are no longer pending
        await cur.execute(
            db.sql(
                "WITH done AS ("
                "  DELETE FROM {s}.auctions a USING {s}.tasks t"
                "  WHERE t.id = a.task_id AND t.state <> 'pending' RETURNING a.task_id"
                ") DELETE FROM {s}.bids WHERE task_id IN (SELECT task_id FROM done)"
            )
        )
        if moved:
            await db.notify(cur, lowered=True)
        return moved

    return await db.run(run)


async def _return_lapsed(db: Database, cur: Cursor) -> int:
    """The claims whose lease lapsed, locked; the domain decides what each becomes (pending
    again, or dead on its last attempt), applied here. Returns how many moved."""
    await cur.execute(
        db.sql(
            "SELECT id, fence, owner, attempts, max_attempts FROM {s}.tasks"
            " WHERE state IN ('claimed', 'running') AND lease_deadline < {now}"
            " FOR UPDATE SKIP LOCKED"
        ),
        db.params(),
    )
    decided = [
        (tid, fence, rules.expired(owner, attempts, max_attempts))
        for tid, fence, owner, attempts, max_attempts in await cur.fetchall()
    ]
    return await _apply_expiry(db, cur, decided)


async def _apply_expiry(db: Database, cur: Cursor, decided: list[Decided]) -> int:
    """Apply expiry outcomes to rows the caller locked, and settle the dependants of those
    that died."""
    if not decided:
        return 0
    sql, outcomes = apply(db, LOCKED, decided)
    await cur.execute(sql, db.params(**outcomes))
    rows = await cur.fetchall()
    ends = {tid for tid, _, o in decided if o.ends}
    dead = [(r[0], r[1]) for r in rows if r[0] in ends]
    if dead:
        await settle_dependents(db, cur, dead)
    return len(rows)


async def end_session(db: Database, expert: str, session: str) -> int:
    """End *session* of *expert* and send its tasks through expiry, in one transaction.

    The expert's row is updated first and stays locked to the end: a claim of that session
    (which holds the row ``FOR SHARE``) or a renewal waits and then finds it lapsed; an owner
    write waiting on a task row finds, once this commits, a task it no longer holds."""

    async def run(cur: Cursor) -> int:
        await cur.execute(
            db.sql(
                "UPDATE {s}.experts SET lease_deadline = least(lease_deadline, {now} - 1e-6),"
                " load = 0 WHERE id = %(expert)s AND session = %(session)s RETURNING 1"
            ),
            db.params(expert=expert, session=session),
        )
        if await cur.fetchone() is None:
            return 0
        # Every claim of the expert's name: this session's, and any a lapsed one left behind.
        await cur.execute(
            db.sql(
                "SELECT id, fence, attempts, max_attempts FROM {s}.tasks"
                " WHERE owner = %(expert)s AND state IN ('claimed', 'running') FOR UPDATE"
            ),
            db.params(expert=expert),
        )
        decided = [
            (tid, fence, rules.expired(expert, attempts, most, session_ended=True))
            for tid, fence, attempts, most in await cur.fetchall()
        ]
        moved = await _apply_expiry(db, cur, decided)
        if moved:
            await db.notify(cur, lowered=True)
        return moved

    return await db.run(run)


async def age(db: Database, cur: Cursor) -> None:
    """Ageing: raise the effective priority of pending tasks whose next step is due
    (computed here with the domain's functions, so every backend rounds alike), from their
    due time. A store that never had a priority other than 0 (no ``levels`` feature) writes
    nothing: ageing could not change its order (``domain.task.AGEING``); the check
    is the statement's one-time filter, so such a store pays no index scan."""
    await cur.execute(
        db.sql(
            "SELECT {now}, id, priority, run_at FROM {s}.tasks "
            "WHERE state = 'pending' AND promote_at <= {now} "
            f" AND {SOME_LEVELS} LIMIT 5000 FOR UPDATE SKIP LOCKED"
        ),
        db.params(),
    )
    due = await cur.fetchall()
    if not due:
        return
    ids, aged, promote = [], [], []
    for now, tid, priority, run_at in due:
        step = aged_priority(priority, now - run_at)
        ids.append(tid)
        aged.append(step)
        promote.append(next_promotion(priority, step, run_at))
    await cur.execute(
        db.sql(
            "UPDATE {s}.tasks t SET eff_priority = u.aged, promote_at = u.promote "
            "FROM unnest(%s::text[], %s::int[], %s::float8[]) AS u(id, aged, promote) "
            "WHERE t.id = u.id"
        ),
        (ids, aged, promote),
    )
    await db.notify(cur, lowered=True)  # a promoted task may stand below a floor of its level
