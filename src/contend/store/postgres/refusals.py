"""Why a fenced owner write did not land, read back in the same transaction as the write."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from contend.errors import FencedOut
from contend.store.postgres.database import Cursor, Database


async def refusals(
    db: Database,
    cur: Cursor,
    expert: str,
    items: Sequence[tuple[str, int]],
    landed: Iterable[str],
    states: tuple[str, ...],
    earlier: Sequence[str] = (),
) -> list[FencedOut | None]:
    """Per item: None when the fenced write landed, else why it was refused (read back in
    the same transaction). A task named twice in one batch lands once.

    *earlier* names the history events this write leaves; it is given when the write is
    being retried after a lost connection, whose first try may have committed although
    its reply never came. An item refused now whose event, by this expert at this fence,
    is already in the history landed then: it is reported as landed, not fenced out (only
    the owner of a fence can write at that fence, so the event is this write's own)."""
    todo = {tid: 1 for tid in landed}
    out: list[FencedOut | None] = []
    found: dict[str, Sequence[Any]] = {}
    done_before: set[tuple[str, int]] = set()
    if len(items) > len(todo):
        ids = [tid for tid, _ in items]
        await cur.execute(
            db.sql(
                "SELECT id, fence, owner, state, lease_deadline, lease_deadline >= {now}, "
                "(SELECT e.lease_deadline >= {now} FROM {s}.experts e "
                " WHERE e.id = %(expert)s) "
                "FROM {s}.tasks WHERE id = ANY(%(ids)s)"
            ),
            db.params(ids=ids, expert=expert),
        )
        found = {r[0]: r for r in await cur.fetchall()}
        if earlier:
            await cur.execute(
                db.sql(
                    "SELECT task_id, fence FROM {s}.task_events WHERE task_id = ANY(%s) "
                    "AND expert = %s AND event = ANY(%s)"
                ),
                (ids, expert, list(earlier)),
            )
            done_before = {(r[0], r[1]) for r in await cur.fetchall()}
    for tid, fence in items:
        if todo.get(tid):
            todo[tid] = 0
            out.append(None)
            continue
        if (tid, fence) in done_before:
            out.append(None)
            continue
        r = found.get(tid)
        if r is None:
            out.append(FencedOut(tid, fence, "no such task"))
        elif r[1] != fence:
            out.append(FencedOut(tid, fence, f"the task is at fence {r[1]}"))
        elif r[2] != expert:
            out.append(FencedOut(tid, fence, f"{expert} does not own it (owner: {r[2]})"))
        elif r[3] not in states:
            out.append(FencedOut(tid, fence, f"the task is {r[3]}"))
        elif r[4] is None or not r[5]:
            out.append(FencedOut(tid, fence, "the lease lapsed"))
        elif not r[6]:
            out.append(FencedOut(tid, fence, f"the lease of expert {expert} lapsed"))
        else:
            out.append(FencedOut(tid, fence, "the task changed during the write"))
    return out
