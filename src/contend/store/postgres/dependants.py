"""Dependants of tasks that just ended: the domain's
:func:`~contend.domain.transitions.dependency_ended` decides what each waiting dependant
becomes (one fewer dependency left, ready, or dead), and a dependant that dies settles its own
in turn. Dependants made pending wake the idle experts here: the ended task's own notice says
only ``end`` when it frees nothing else (``apply``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from contend.domain import transitions as rules
from contend.domain.task import TaskState, if_failed_of
from contend.store.postgres.apply import LOCKED, Decided, apply, lowers
from contend.store.postgres.database import Cursor, Database


async def settle_dependents(db: Database, cur: Cursor, ended: Sequence[tuple[str, str]]) -> None:
    """Tell the waiting dependants of *ended* ((task, the state it ended in), in the order
    they ended) that those dependencies are over, down the chain."""
    todo = [(tid, TaskState(state)) for tid, state in ended]
    while todo:
        waiting = await _waiting_on(db, cur, [tid for tid, _ in todo])
        if not waiting:
            return
        decided, still = _decide(todo, waiting)
        await _apply(db, cur, decided, still)
        ready = [o for _, _, o in decided if o.state == TaskState.PENDING]
        if ready:  # work for the idle experts (the ended task's own notice may say "end")
            # due since they were submitted: below the floors, unless due from now
            await db.notify(cur, lowered=any(lowers(o) for o in ready))
        todo = [(tid, o.state) for tid, _, o in decided if o.ends]


class Waiter(NamedTuple):
    """A dependant still waiting: its fence, its dependencies left, which of the ended ones it
    waited on, and the choice of each of its edges (:func:`~contend.domain.task.if_failed_of`
    of its ``depends_on`` and ``if_failed``)."""

    fence: int
    left: int
    ended: list[str]
    depends_on: list[str]
    if_failed: list[str]


Waiting = dict[str, Waiter]


#: The edges of the ended tasks (``%(ids)s``) removed; their dependants still waiting, locked.
WAITING_ON = (
    "WITH gone AS ("
    "  DELETE FROM {s}.task_deps WHERE dep_id = ANY(%(ids)s) RETURNING dep_id, task_id"
    ") SELECT g.dep_id, t.id, t.fence, t.deps_left, t.depends_on, t.if_failed"
    " FROM gone g JOIN {s}.tasks t ON t.id = g.task_id"
    " WHERE t.state = 'waiting' AND EXISTS (SELECT FROM gone)"
    " ORDER BY t.id FOR UPDATE OF t"
)


async def _waiting_on(db: Database, cur: Cursor, ended: list[str]) -> Waiting:
    """Remove the dependency edges of *ended*; the dependants still waiting, locked.

    A statement of its own, after the write that ended them: it sees a dependant whose
    submission committed while that write waited for the dependency's row lock.

    ``EXISTS (SELECT FROM gone)`` is a one-time filter: where no edge was removed (the usual
    case) the plan reads nothing of ``tasks``, whatever join it chose. A generic plan made
    while the table was new and small joined by a whole scan of it, and kept doing so until
    the first ANALYZE: at 1,000 tasks/s on a fresh store this statement grew to 6.6 ms and
    1,569 buffers a call within a minute, and pickup p50 from 5 to 31 ms."""
    await cur.execute(db.sql(WAITING_ON), db.params(ids=ended))
    waiting: Waiting = {}
    for dep, tid, fence, left, deps, choices in await cur.fetchall():
        waiting.setdefault(tid, Waiter(fence, left, [], deps or [], choices or [])).ended.append(
            dep
        )
    return waiting


def _decide(
    ended: list[tuple[str, TaskState]], waiting: Waiting
) -> tuple[list[Decided], list[tuple[str, int]]]:
    """Each dependant's outcome, its ended dependencies taken in the order they ended; and
    (dependant, dependencies left) of those that go on waiting."""
    order = {tid: n for n, (tid, _) in enumerate(ended)}
    how = dict(ended)
    decided: list[Decided] = []
    still: list[tuple[str, int]] = []
    for tid, w in waiting.items():
        outcome = None
        left = w.left
        for dep in sorted(w.ended, key=order.__getitem__):
            choice = if_failed_of(w.depends_on, w.if_failed, dep)
            outcome = rules.dependency_ended(dep, how[dep], left, choice)
            left -= 1
            if outcome is not None:
                break
        if outcome is None:
            still.append((tid, left))
        else:
            decided.append((tid, w.fence, outcome))
    return decided, still


async def _apply(
    db: Database, cur: Cursor, decided: list[Decided], still: list[tuple[str, int]]
) -> None:
    """One statement: the outcomes, and the count of those that go on waiting."""
    counted = (
        "counted AS ("
        "  UPDATE {s}.tasks t SET deps_left = c.n"
        "  FROM unnest(%(still)s::text[], %(left)s::int[]) AS c(id, n) WHERE t.id = c.id"
        "),"
    )
    sql, outcomes = apply(db, LOCKED, decided, before=counted)
    await cur.execute(
        sql,
        db.params(still=[tid for tid, _ in still], left=[n for _, n in still], **outcomes),
    )
