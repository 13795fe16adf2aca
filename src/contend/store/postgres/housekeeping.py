"""Housekeeping, run by :meth:`PostgresStore.expire`: lapsed claims go back (or die on their
last attempt), pending tasks age, long-gone experts and finished auctions are deleted."""

from __future__ import annotations

from contend.domain.task import aged_priority, next_promotion
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.dependants import settle_dependents


async def expire(db: Database) -> int:
    lost = (
        "jsonb_build_object('type', 'LeaseExpired', 'message', "
        "'expert ' || coalesce(l.owner, '?') || ' lost its lease on the last attempt')::text"
    )
    sql = db.sql(
        "WITH lapsed AS ("
        "  SELECT id, owner FROM {s}.tasks"
        "  WHERE state IN ('claimed', 'running') AND lease_deadline < {now}"
        "  FOR UPDATE SKIP LOCKED"
        "), moved AS ("
        "  UPDATE {s}.tasks t SET"
        "   state = CASE WHEN t.attempts < t.max_attempts THEN 'pending' ELSE 'dead' END,"
        f"   error = CASE WHEN t.attempts < t.max_attempts THEN t.error ELSE {lost} END,"
        "   owner = NULL, lease_deadline = NULL, updated_at = {now}"
        "  FROM lapsed l WHERE t.id = l.id"
        "  RETURNING t.id, t.state, t.fence, l.owner"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
        "  SELECT id, {now}, 'expired', fence, owner FROM moved"
        ") SELECT id, state FROM moved"
    )

    async def run(cur: Cursor) -> int:
        await cur.execute(sql, db.params())
        rows = await cur.fetchall()
        dead = [(r[0], r[1]) for r in rows if r[1] == "dead"]
        if dead:
            await settle_dependents(db, cur, dead)
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
        if rows:
            await db.notify(cur)
        return len(rows)

    return await db.run(run)


async def age(db: Database, cur: Cursor) -> None:
    """Ageing: raise the effective priority of pending tasks whose next step is due
    (computed here with the domain's functions, so every backend rounds alike)."""
    await cur.execute(
        db.sql(
            "SELECT {now}, id, priority, created_at FROM {s}.tasks "
            "WHERE state = 'pending' AND promote_at <= {now} LIMIT 5000 "
            "FOR UPDATE SKIP LOCKED"
        ),
        db.params(),
    )
    due = await cur.fetchall()
    if not due:
        return
    ids, aged, promote = [], [], []
    for now, tid, priority, created in due:
        step = aged_priority(priority, now - created)
        ids.append(tid)
        aged.append(step)
        promote.append(next_promotion(priority, step, created))
    await cur.execute(
        db.sql(
            "UPDATE {s}.tasks t SET eff_priority = u.aged, promote_at = u.promote "
            "FROM unnest(%s::text[], %s::int[], %s::float8[]) AS u(id, aged, promote) "
            "WHERE t.id = u.id"
        ),
        (ids, aged, promote),
    )
