"""An owner's fenced writes: start, checkpoint, complete, fail, release.

The domain decides each item's outcome (``contend.domain.transitions``); one statement per
batch applies each only while the fenced condition holds (fence, owner, an accepted state, the
task's lease and the expert's), and the items it did not touch are explained by
:func:`~contend.store.postgres.refusals.refusals` in the same transaction. A write retried
after a lost reply recognises its own earlier landing by its history event."""

from __future__ import annotations

from collections.abc import Sequence

from contend.domain import transitions as rules
from contend.domain.task import TaskState
from contend.errors import FencedOut
from contend.store._common import check_retry_delay
from contend.store.port import Completion, Failure
from contend.store.postgres.apply import Decided, apply
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.dependants import settle_dependents
from contend.store.postgres.refusals import refusals

# The fenced condition shared by every owner write (``i`` is the batch, ``t`` the task).
FENCED = (
    "t.id = i.id AND t.fence = i.fence AND t.owner = %(expert)s "
    "AND t.state = ANY(%(states)s) AND t.lease_deadline >= {now} "
    "AND EXISTS (SELECT 1 FROM {s}.experts e WHERE e.id = %(expert)s "
    "AND e.lease_deadline >= {now})"
)


async def start(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    outcome = rules.started(expert)
    decided = [(tid, fence, outcome) for tid, fence in items]
    return await _write(db, expert, decided, rules.START_STATES, notify=False)


async def complete(
    db: Database, expert: str, items: Sequence[Completion]
) -> list[FencedOut | None]:
    decided = [(i.task_id, i.fence, rules.completed(expert, i.result_json)) for i in items]
    return await _write(db, expert, decided, rules.WRITE_STATES)


async def fail(db: Database, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
    for item in items:
        check_retry_delay(item.retry_delay)
    decided = [
        (i.task_id, i.fence, rules.failed(expert, i.error_json, i.retry_delay, i.final_state))
        for i in items
    ]
    return await _write(db, expert, decided, rules.WRITE_STATES)


async def release(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    outcome = rules.released(expert)
    decided = [(tid, fence, outcome) for tid, fence in items]
    return await _write(db, expert, decided, rules.WRITE_STATES)


async def _write(
    db: Database,
    expert: str,
    decided: Sequence[Decided],
    states: frozenset[TaskState],
    *,
    notify: bool = True,
) -> list[FencedOut | None]:
    """Apply *decided* where *expert* holds each task at its fence in one of *states*; settle
    the dependants of those that end (then in a transaction, so that they settle with it)."""
    if not decided:
        return []
    sql, outcomes = apply(db, FENCED, decided, notify=notify)
    pairs = [(tid, fence) for tid, fence, _ in decided]
    ends = {tid for tid, _, o in decided if o.ends}
    order = {tid: n for n, (tid, _, _) in enumerate(decided)}
    tries = 0

    async def run(cur: Cursor) -> list[FencedOut | None]:
        nonlocal tries
        tries += 1
        await cur.execute(
            sql,
            db.params(
                expert=expert,
                states=[str(s) for s in sorted(states)],
                channel=db.channel,
                **outcomes,
            ),
        )
        rows = await cur.fetchall()
        ended = sorted(((r[0], r[1]) for r in rows if r[0] in ends), key=lambda r: order[r[0]])
        if ended:
            await settle_dependents(db, cur, ended)
        earlier = [o.event for _, _, o in decided] if tries > 1 else []
        return await refusals(db, cur, expert, pairs, [r[0] for r in rows], states, earlier)

    return await db.run(run, tx=bool(ends))


async def checkpoint(db: Database, expert: str, task_id: str, fence: int, state_json: str) -> None:
    """Save a running task's state under its fence (no transition, no history line)."""
    await _save(db, expert, task_id, fence, "checkpoint", state_json)


async def progress(db: Database, expert: str, task_id: str, fence: int, progress_json: str) -> None:
    """Save a running task's progress under its fence, as a checkpoint is saved."""
    await _save(db, expert, task_id, fence, "progress", progress_json)


async def _save(
    db: Database, expert: str, task_id: str, fence: int, column: str, state_json: str
) -> None:
    assert column in ("checkpoint", "progress")
    sql = db.sql(
        f"UPDATE {{s}}.tasks t SET {column} = %(state)s, updated_at = {{now}} "
        "FROM unnest(%(ids)s::text[], %(fences)s::bigint[]) AS i(id, fence) "
        f"WHERE {FENCED} RETURNING t.id"
    )
    items = [(task_id, fence)]
    states = rules.WRITE_STATES

    async def run(cur: Cursor) -> FencedOut | None:
        await cur.execute(
            sql,
            db.params(
                expert=expert,
                states=[str(s) for s in sorted(states)],
                ids=[task_id],
                fences=[fence],
                state=state_json,
            ),
        )
        landed = [r[0] for r in await cur.fetchall()]
        (res,) = await refusals(db, cur, expert, items, landed, states)
        return res

    res = await db.run(run, tx=False)
    if res is not None:
        raise res
