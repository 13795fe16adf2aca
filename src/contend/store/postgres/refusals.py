"""Why a fenced owner write did not land: what the store holds of each task it missed, read
back in the same transaction as the write and explained by the domain's
:func:`~contend.domain.transitions.refusal`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from contend.domain import transitions as rules
from contend.domain.task import TaskState
from contend.domain.transitions import Event, Holding
from contend.errors import FencedOut
from contend.store.postgres.database import Cursor, Database


async def refusals(
    db: Database,
    cur: Cursor,
    expert: str,
    items: Sequence[tuple[str, int]],
    landed: Iterable[str],
    states: frozenset[TaskState],
    earlier: Sequence[Event] = (),
) -> list[FencedOut | None]:
    """Per item: None when the fenced write landed, else why it was refused. A task named
    twice in one batch lands once.

    *earlier* has, item by item, the history event the write leaves; it is given when the write
    is being retried after a lost connection, whose first try may have committed although its
    reply never came. An item refused now whose event, by this expert at this fence, is already
    in the history landed then: it is reported as landed, not fenced out (only the owner of a
    fence can write at that fence, so the event is this write's own)."""
    todo = {tid: 1 for tid in landed}
    if len(items) <= len(todo):
        return [None] * len(items)
    ids = [tid for tid, _ in items]
    now, expert_live, found = await _holdings(db, cur, expert, ids)
    done_before: set[tuple[str, int, str]] = set()
    if earlier:
        await cur.execute(
            db.sql(
                "SELECT task_id, fence, event FROM {s}.task_events WHERE task_id = ANY(%s) "
                "AND expert = %s AND event = ANY(%s)"
            ),
            (ids, expert, sorted({str(e) for e in earlier})),
        )
        done_before = {(r[0], r[1], r[2]) for r in await cur.fetchall()}
    out: list[FencedOut | None] = []
    for n, (tid, fence) in enumerate(items):
        if todo.get(tid):
            todo[tid] = 0
            out.append(None)
        elif earlier and (tid, fence, str(earlier[n])) in done_before:
            out.append(None)
        else:
            why = rules.refusal(
                tid, fence, expert, found.get(tid), now, expert_live=expert_live, states=states
            )
            out.append(why or rules.raced(tid, fence))
    return out


async def refusal_now(
    db: Database,
    cur: Cursor,
    expert: str,
    task_id: str,
    fence: int,
    states: frozenset[TaskState],
) -> FencedOut | None:
    """Why *expert* may not write *task_id* at *fence* now (None: it may), as the domain's
    :func:`~contend.domain.transitions.refusal` says from what the store holds, the leases
    judged at the time the statement runs (in a transaction begun long ago, too)."""
    now_, expert_live, found = await _holdings(db, cur, expert, [task_id], live=True)
    return rules.refusal(
        task_id, fence, expert, found.get(task_id), now_, expert_live=expert_live, states=states
    )


async def _holdings(
    db: Database, cur: Cursor, expert: str, ids: list[str], *, live: bool = False
) -> tuple[float, bool, dict[str, Holding]]:
    """The store's now (*live*: when the statement runs), whether *expert*'s lease is live,
    and what the store holds of those of *ids* that exist (one row even when none does)."""
    params = db.params(ids=ids, expert=expert)
    await cur.execute(
        db.sql(
            "SELECT {now}, (SELECT e.lease_deadline >= {now} FROM {s}.experts e"
            "  WHERE e.id = %(expert)s), t.id, t.fence, t.owner, t.state, t.lease_deadline"
            " FROM (VALUES (1)) AS one(x) LEFT JOIN {s}.tasks t ON t.id = ANY(%(ids)s)",
            live=live,
        ),
        params,
    )
    rows: list[Any] = await cur.fetchall()
    found = {r[2]: Holding(r[3], r[4], r[5], r[6]) for r in rows if r[2] is not None}
    return float(rows[0][0]), bool(rows[0][1]), found
