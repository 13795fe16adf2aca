"""Retention: deleting old finished tasks whole, and capping each task's history
(``contend.domain.retention`` says which tasks and how much)."""

from __future__ import annotations

from time import monotonic

from contend.domain.retention import PRUNABLE_STATES, TRIM_EVERY, check_prune
from contend.store.postgres.database import Cursor, Database

#: The finished states but succeeded (which the ``tasks_done`` partial index covers).
_OTHERS = sorted(str(s) for s in PRUNABLE_STATES if str(s) != "succeeded")
_IN_OTHERS = ", ".join(f"'{state}'" for state in _OTHERS)  # literals: the state index serves

# The oldest finished tasks that no waiting task waits on (a dependency's edges go when it
# ends and its waiters are settled): succeeded ones by their partial index (a literal state,
# so the planner may use it), the others by the state index; locked, and skipped when someone
# else holds them; then everything of theirs, in one statement.
_UNSETTLED = "NOT EXISTS (SELECT 1 FROM {s}.task_deps d WHERE d.dep_id = t.id)"
_PRUNE = (
    "WITH done AS ("
    "  SELECT id, updated_at FROM {s}.tasks t WHERE state = 'succeeded'"
    f"  AND updated_at < %(before)s AND {_UNSETTLED} ORDER BY updated_at LIMIT %(limit)s"
    "), other AS ("
    f"  SELECT id, updated_at FROM {{s}}.tasks t WHERE state IN ({_IN_OTHERS})"
    f"  AND updated_at < %(before)s AND {_UNSETTLED} ORDER BY updated_at LIMIT %(limit)s"
    "), old AS ("
    "  SELECT t.id FROM {s}.tasks t JOIN (SELECT * FROM done UNION ALL SELECT * FROM other"
    "   ORDER BY updated_at LIMIT %(limit)s) c ON c.id = t.id FOR UPDATE OF t SKIP LOCKED"
    # by each table's index on the task id (a join would hash a scan of the whole history)
    "), events AS (DELETE FROM {s}.task_events e WHERE e.task_id = ANY(ARRAY(SELECT id FROM old))"
    "), edges AS (DELETE FROM {s}.task_deps d WHERE d.task_id = ANY(ARRAY(SELECT id FROM old))"
    "), bids AS (DELETE FROM {s}.bids b WHERE b.task_id = ANY(ARRAY(SELECT id FROM old))"
    "), auctions AS (DELETE FROM {s}.auctions a WHERE a.task_id = ANY(ARRAY(SELECT id FROM old))"
    "), gone AS (DELETE FROM {s}.tasks t WHERE t.id = ANY(ARRAY(SELECT id FROM old)) RETURNING t.id"
    ") SELECT count(*) FROM gone"
)

#: History lines whose tasks one pass checks against the cap.
TRIM_WINDOW = 5000

# Of the tasks of the next TRIM_WINDOW history lines after %(since)s (a cursor that goes
# round the table, one step a pass), those over the cap keep their first line and newest.
_TRIM = (
    "WITH win AS ("
    "  SELECT seq, task_id FROM {s}.task_events WHERE seq > %(since)s ORDER BY seq"
    "  LIMIT %(window)s"
    "), long AS ("
    "  SELECT w.task_id FROM (SELECT DISTINCT task_id FROM win) w"
    "  WHERE (SELECT count(*) FROM {s}.task_events e WHERE e.task_id = w.task_id) > %(keep)s"
    "  LIMIT %(limit)s"
    "), ranked AS ("
    "  SELECT e.seq, row_number() OVER (PARTITION BY e.task_id ORDER BY e.seq DESC) AS back,"
    "   row_number() OVER (PARTITION BY e.task_id ORDER BY e.seq) AS fwd"
    "  FROM {s}.task_events e JOIN long USING (task_id)"
    "), trimmed AS ("
    "  DELETE FROM {s}.task_events e USING ranked r"
    "  WHERE e.seq = r.seq AND r.back >= %(keep)s AND r.fwd > 1"
    ") SELECT max(seq), count(*) FROM win"
)


async def prune(db: Database, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
    before, limit, keep_events = check_prune(before, limit, keep_events)

    async def run(cur: Cursor) -> int:
        params = {"before": before, "limit": limit}
        await cur.execute(db.sql(_PRUNE), params)
        row = await cur.fetchone()
        deleted = int(row[0]) if row else 0
        if monotonic() >= db.trim_next:
            db.trim_next = monotonic() + TRIM_EVERY
            trim = {"since": db.trim_cursor, "window": TRIM_WINDOW, "keep": keep_events}
            await cur.execute(db.sql(_TRIM), {**trim, "limit": limit})
            last, seen = await cur.fetchone() or (None, 0)
            db.trim_cursor = 0 if last is None or seen < TRIM_WINDOW else int(last)
        if deleted:
            await db.notify(cur)
        return deleted

    return await db.run(run)
