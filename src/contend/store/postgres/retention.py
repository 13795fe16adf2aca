"""Retention: deleting old finished tasks whole, and capping each task's history
(``contend.domain.retention`` says which tasks and how much)."""

from __future__ import annotations

from contend.domain.retention import PRUNABLE_STATES, check_prune
from contend.store.postgres.database import Cursor, Database

_STATES = sorted(str(s) for s in PRUNABLE_STATES)

# The oldest finished tasks that no waiting task waits on (a dependency's edges go when it
# ends and its waiters are settled), locked and skipped when someone else holds them, then
# everything of theirs, in one statement.
_PRUNE = (
    "WITH old AS ("
    "  SELECT id FROM {s}.tasks t WHERE state = ANY(%(states)s) AND updated_at < %(before)s"
    "  AND NOT EXISTS (SELECT 1 FROM {s}.task_deps d WHERE d.dep_id = t.id)"
    "  ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
    "), events AS (DELETE FROM {s}.task_events e USING old WHERE e.task_id = old.id"
    "), edges AS (DELETE FROM {s}.task_deps d USING old WHERE d.task_id = old.id"
    "), bids AS (DELETE FROM {s}.bids b USING old WHERE b.task_id = old.id"
    "), auctions AS (DELETE FROM {s}.auctions a USING old WHERE a.task_id = old.id"
    "), gone AS (DELETE FROM {s}.tasks t USING old WHERE t.id = old.id RETURNING t.id"
    ") SELECT count(*) FROM gone"
)

# Of up to *limit* tasks over the cap, keep the first history line and the newest ones.
_TRIM = (
    "WITH long AS ("
    "  SELECT task_id FROM {s}.task_events GROUP BY task_id HAVING count(*) > %(keep)s"
    "  LIMIT %(limit)s"
    "), ranked AS ("
    "  SELECT e.seq, row_number() OVER (PARTITION BY e.task_id ORDER BY e.seq DESC) AS back,"
    "   row_number() OVER (PARTITION BY e.task_id ORDER BY e.seq) AS fwd"
    "  FROM {s}.task_events e JOIN long USING (task_id)"
    ") DELETE FROM {s}.task_events e USING ranked r"
    " WHERE e.seq = r.seq AND r.back >= %(keep)s AND r.fwd > 1"
)


async def prune(db: Database, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
    before, limit, keep_events = check_prune(before, limit, keep_events)

    async def run(cur: Cursor) -> int:
        params = {"states": _STATES, "before": before, "limit": limit}
        await cur.execute(db.sql(_PRUNE), params)
        row = await cur.fetchone()
        deleted = int(row[0]) if row else 0
        await cur.execute(db.sql(_TRIM), {"keep": keep_events, "limit": limit})
        if deleted:
            await db.notify(cur)
        return deleted

    return await db.run(run)
