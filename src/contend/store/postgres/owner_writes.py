"""An owner's fenced writes: start, checkpoint, complete, fail, release.

Each is one ``UPDATE … FROM unnest(…)`` per batch under the fenced condition (fence, owner,
state, the task's lease and the expert's); the items it did not touch are explained by
:func:`~contend.store.postgres.refusals.refusals` in the same transaction. A write retried
after a lost reply recognises its own earlier landing by its history event."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contend.domain.task import TaskState
from contend.errors import FencedOut
from contend.store._common import check_retry_delay
from contend.store.port import Completion, Failure
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.dependants import settle_dependents
from contend.store.postgres.refusals import refusals

_OWNED = ("claimed", "running")

# The fenced condition shared by every owner write (``i`` is the batch, ``t`` the task).
FENCED = (
    "t.id = i.id AND t.fence = i.fence AND t.owner = %(expert)s "
    "AND t.state = ANY(%(states)s) AND t.lease_deadline >= {now} "
    "AND EXISTS (SELECT 1 FROM {s}.experts e WHERE e.id = %(expert)s "
    "AND e.lease_deadline >= {now})"
)


def _batch(
    db: Database,
    expert: str,
    items: Sequence[tuple[str, int]],
    states: tuple[str, ...],
    **more: Any,
) -> dict[str, Any]:
    return db.params(
        expert=expert,
        states=list(states),
        ids=[tid for tid, _ in items],
        fences=[fence for _, fence in items],
        **more,
    )


async def start(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    if not items:
        return []
    sql = db.sql(
        "WITH done AS ("
        "  UPDATE {s}.tasks t SET state = 'running', updated_at = {now}"
        "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[]) AS i(id, fence)"
        f"  WHERE {FENCED} RETURNING t.id, t.fence"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
        "  SELECT id, {now}, 'started', fence, %(expert)s FROM done"
        ") SELECT id FROM done"
    )

    tries = 0

    async def run(cur: Cursor) -> list[FencedOut | None]:
        nonlocal tries
        tries += 1
        await cur.execute(sql, _batch(db, expert, items, ("claimed",)))
        landed = [r[0] for r in await cur.fetchall()]
        earlier = ("started",) if tries > 1 else ()
        return await refusals(db, cur, expert, items, landed, ("claimed",), earlier)

    return await db.run(run, tx=False)


async def checkpoint(db: Database, expert: str, task_id: str, fence: int, state_json: str) -> None:
    sql = db.sql(
        "UPDATE {s}.tasks t SET checkpoint = %(state)s, updated_at = {now} "
        "FROM unnest(%(ids)s::text[], %(fences)s::bigint[]) AS i(id, fence) "
        f"WHERE {FENCED} RETURNING t.id"
    )
    items = [(task_id, fence)]

    async def run(cur: Cursor) -> FencedOut | None:
        await cur.execute(sql, _batch(db, expert, items, _OWNED, state=state_json))
        landed = [r[0] for r in await cur.fetchall()]
        (res,) = await refusals(db, cur, expert, items, landed, _OWNED)
        return res

    res = await db.run(run, tx=False)
    if res is not None:
        raise res


async def complete(
    db: Database, expert: str, items: Sequence[Completion]
) -> list[FencedOut | None]:
    if not items:
        return []
    pairs = [(i.task_id, i.fence) for i in items]
    sql = db.sql(
        "WITH done AS ("
        "  UPDATE {s}.tasks t SET state = 'succeeded', result = i.result, owner = NULL,"
        "   lease_deadline = NULL, updated_at = {now}"
        "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[], %(results)s::text[])"
        "   AS i(id, fence, result)"
        f"  WHERE {FENCED} RETURNING t.id, t.fence"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
        "  SELECT id, {now}, 'succeeded', fence, %(expert)s FROM done"
        ") SELECT id FROM done"
    )

    tries = 0

    async def run(cur: Cursor) -> list[FencedOut | None]:
        nonlocal tries
        tries += 1
        await cur.execute(
            sql, _batch(db, expert, pairs, _OWNED, results=[i.result_json for i in items])
        )
        landed = [r[0] for r in await cur.fetchall()]
        if landed:
            # A statement of its own, so that it sees a dependent whose submission
            # committed while the UPDATE above waited for the dependency's row lock.
            await settle_dependents(db, cur, [(tid, "succeeded") for tid in landed])
            await db.notify(cur)  # wakes result() waiters, and experts if dependents woke
        earlier = ("succeeded",) if tries > 1 else ()
        return await refusals(db, cur, expert, pairs, landed, _OWNED, earlier)

    return await db.run(run)


async def fail(db: Database, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
    for item in items:
        check_retry_delay(item.retry_delay)
    if not items:
        return []
    pairs = [(i.task_id, i.fence) for i in items]
    retry = "i.delay IS NOT NULL AND t.attempts < t.max_attempts"
    sql = db.sql(
        "WITH done AS ("
        "  UPDATE {s}.tasks t SET"
        f"   state = CASE WHEN {retry} THEN 'pending' ELSE i.final END,"
        f"   run_at = CASE WHEN {retry} THEN {{now}} + i.delay ELSE t.run_at END,"
        "   error = i.error, owner = NULL, lease_deadline = NULL, updated_at = {now}"
        "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[], %(errors)s::text[],"
        "   %(delays)s::float8[], %(finals)s::text[], %(details)s::text[])"
        "   AS i(id, fence, error, delay, final, detail)"
        f"  WHERE {FENCED}"
        "  RETURNING t.id, t.fence, t.state,"
        "   CASE WHEN t.state = 'pending' THEN i.detail END AS detail"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
        "  SELECT id, {now}, CASE WHEN state = 'pending' THEN 'retry' ELSE state END,"
        "   fence, %(expert)s, detail FROM done"
        ") SELECT id, state FROM done"
    )
    params = dict(
        errors=[i.error_json for i in items],
        delays=[i.retry_delay for i in items],
        finals=[str(i.final_state if i.retry_delay is None else TaskState.DEAD) for i in items],
        details=[None if i.retry_delay is None else f"in {i.retry_delay:.3f}s" for i in items],
    )

    tries = 0

    async def run(cur: Cursor) -> list[FencedOut | None]:
        nonlocal tries
        tries += 1
        await cur.execute(sql, _batch(db, expert, pairs, _OWNED, **params))
        rows = await cur.fetchall()
        settled = [(r[0], r[1]) for r in rows if r[1] != "pending"]
        if settled:
            await settle_dependents(db, cur, settled)
        if rows:
            await db.notify(cur)
        # not "cancelled": cancel records the owner it fenced out at the same fence
        earlier = ("retry", "failed", "dead") if tries > 1 else ()
        landed = [r[0] for r in rows]
        return await refusals(db, cur, expert, pairs, landed, _OWNED, earlier)

    return await db.run(run)


async def release(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    if not items:
        return []
    sql = db.sql(
        "WITH done AS ("
        "  UPDATE {s}.tasks t SET state = 'pending', owner = NULL, lease_deadline = NULL,"
        "   attempts = greatest(0, t.attempts - 1), updated_at = {now}"
        "  FROM unnest(%(ids)s::text[], %(fences)s::bigint[]) AS i(id, fence)"
        f"  WHERE {FENCED} RETURNING t.id, t.fence"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert)"
        "  SELECT id, {now}, 'released', fence, %(expert)s FROM done"
        ") SELECT id, pg_notify(%(channel)s, '') FROM done"
    )

    tries = 0

    async def run(cur: Cursor) -> list[FencedOut | None]:
        nonlocal tries
        tries += 1
        await cur.execute(sql, _batch(db, expert, items, _OWNED, channel=db.channel))
        landed = [r[0] for r in await cur.fetchall()]
        earlier = ("released",) if tries > 1 else ()
        return await refusals(db, cur, expert, items, landed, _OWNED, earlier)

    return await db.run(run, tx=False)
