"""Owner writes: start, checkpoint, complete, fail and release. Each carries the owner and the
fence and lands only while they are the task's current ones under a live lease; a refused
write changes nothing and is reported as the rulebook's :func:`~contend.domain.transitions.refusal`
explains it. What a write that lands does is the rulebook's outcome, applied as decided."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from contend.domain import transitions as rules
from contend.domain.task import TaskState
from contend.domain.transitions import Holding, Outcome
from contend.errors import FencedOut
from contend.store._common import check_retry_delay
from contend.store.port import Completion, Failure
from contend.store.sqlite.connection import Database
from contend.store.sqlite.outcomes import apply_outcomes
from contend.store.sqlite.rows import chunks

#: The row of a task as a write checks it: id, fence, owner, state, lease deadline, attempts,
#: due time.
_Held = tuple[Any, ...]


def check_owners(
    conn: sqlite3.Connection,
    now: float,
    expert: str,
    items: Sequence[tuple[str, int]],
    states: frozenset[TaskState],
) -> tuple[list[FencedOut | None], list[tuple[int, _Held]]]:
    """Check each (id, fence) against fence, owner, state and lease: the refusal of each item
    (``None`` when it may land), and the index and row of each that may."""
    found: dict[str, _Held] = {}
    for chunk in chunks([i[0] for i in items], 500):
        marks = ",".join("?" * len(chunk))
        for r in conn.execute(
            "SELECT id, fence, owner, state, lease_deadline, attempts, run_at FROM tasks "
            f"WHERE id IN ({marks})",
            chunk,
        ):
            found[r[0]] = r
    lease = conn.execute("SELECT lease_deadline FROM experts WHERE id = ?", (expert,)).fetchone()
    expert_live = lease is not None and lease[0] >= now
    out: list[FencedOut | None] = []
    ok: list[tuple[int, _Held]] = []
    refusal, holding_of = rules.refusal, Holding._make
    for n, (tid, fence) in enumerate(items):
        r = found.get(tid)
        holding = None if r is None else holding_of(r[1:5])  # fence, owner, state, lease
        refused = refusal(tid, fence, expert, holding, now, expert_live=expert_live, states=states)
        out.append(refused)
        if refused is None:
            assert r is not None  # a task that is not there is refused
            ok.append((n, r))
    return out, ok


def _owner_write(
    db: Database,
    expert: str,
    items: Sequence[tuple[str, int]],
    states: frozenset[TaskState],
    outcomes: Sequence[Outcome],
) -> Callable[[sqlite3.Connection], list[FencedOut | None]]:
    """The transaction of an owner write: check each (id, fence), then apply ``outcomes[n]``,
    the rulebook's outcome for item *n*, to each item that passed. The outcomes are decided
    before the transaction begins, so that deciding does not hold the write lock."""

    def run(conn: sqlite3.Connection) -> list[FencedOut | None]:
        now = db.clock()
        out, ok = check_owners(conn, now, expert, items, states)
        if ok:
            changes = [(r[0], r[1], outcomes[n], r[5], r[6]) for n, r in ok]
            apply_outcomes(conn, now, changes)
        return out

    return run


async def start(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    outcomes = [rules.started(expert)] * len(items)
    return await db.tx(_owner_write(db, expert, items, rules.START_STATES, outcomes))


async def checkpoint(db: Database, expert: str, task_id: str, fence: int, state_json: str) -> None:
    await _save(db, expert, task_id, fence, "checkpoint", state_json)


async def progress(db: Database, expert: str, task_id: str, fence: int, progress_json: str) -> None:
    await _save(db, expert, task_id, fence, "progress", progress_json)


async def _save(
    db: Database, expert: str, task_id: str, fence: int, column: str, text: str
) -> None:
    """A fenced write of a running task's checkpoint or progress (no transition)."""
    assert column in ("checkpoint", "progress")

    def run(conn: sqlite3.Connection) -> FencedOut | None:
        now = db.clock()
        (res,), ok = check_owners(conn, now, expert, [(task_id, fence)], rules.WRITE_STATES)
        if ok:
            conn.execute(
                f"UPDATE tasks SET {column} = ?, updated_at = ? WHERE id = ?",
                (text, now, task_id),
            )
        return res

    res = await db.tx(run)
    if res is not None:
        raise res


async def complete(
    db: Database, expert: str, items: Sequence[Completion]
) -> list[FencedOut | None]:
    if not items:
        return []
    pairs = [(i.task_id, i.fence) for i in items]

    outcomes = [rules.completed(expert, i.result_json) for i in items]
    out = await db.tx(_owner_write(db, expert, pairs, rules.WRITE_STATES, outcomes))
    db.wakeups.touch()  # dependants may have become pending
    return out


async def fail(db: Database, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
    for item in items:
        check_retry_delay(item.retry_delay)
    if not items:
        return []
    pairs = [(i.task_id, i.fence) for i in items]

    outcomes = [rules.failed(expert, i.error_json, i.retry_delay, i.final_state) for i in items]
    out = await db.tx(_owner_write(db, expert, pairs, rules.WRITE_STATES, outcomes))
    db.wakeups.touch()
    return out


async def release(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    if not items:
        return []
    outcomes = [rules.released(expert)] * len(items)
    out = await db.tx(_owner_write(db, expert, list(items), rules.WRITE_STATES, outcomes))
    db.wakeups.touch()
    return out
