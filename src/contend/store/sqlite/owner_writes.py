"""Owner writes: start, checkpoint, complete, fail and release. Each carries the owner and the
fence and lands only while they are the task's current ones under a live lease; a refused
write changes nothing and is reported as :class:`~contend.errors.FencedOut`."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from contend.domain.task import TaskState
from contend.errors import FencedOut
from contend.store._common import check_retry_delay
from contend.store.port import Completion, Failure
from contend.store.sqlite.connection import Database
from contend.store.sqlite.dependants import settle_dependents
from contend.store.sqlite.rows import OWNED, chunks, insert_events


def _owner_write(
    db: Database,
    expert: str,
    items: Sequence[tuple[str, int]],
    states: tuple[str, ...],
    apply: Callable[[sqlite3.Connection, float, list[int]], None],
) -> Callable[[sqlite3.Connection], list[FencedOut | None]]:
    """Check each (id, fence) against owner, fence, state and lease; call *apply* with the
    indexes that passed, inside the same transaction."""

    def run(conn: sqlite3.Connection) -> list[FencedOut | None]:
        now = db.clock()
        found: dict[str, tuple[Any, ...]] = {}
        for chunk in chunks([i[0] for i in items], 500):
            marks = ",".join("?" * len(chunk))
            for r in conn.execute(
                f"SELECT id, fence, owner, state, lease_deadline FROM tasks WHERE id IN ({marks})",
                chunk,
            ):
                found[r[0]] = r
        lease = conn.execute(
            "SELECT lease_deadline FROM experts WHERE id = ?", (expert,)
        ).fetchone()
        expert_live = lease is not None and lease[0] >= now
        out: list[FencedOut | None] = []
        ok: list[int] = []
        for n, (tid, fence) in enumerate(items):
            r = found.get(tid)
            if r is None:
                out.append(FencedOut(tid, fence, "no such task"))
            elif r[1] != fence:
                out.append(FencedOut(tid, fence, f"the task is at fence {r[1]}"))
            elif r[2] != expert:
                out.append(FencedOut(tid, fence, f"{expert} does not own it (owner: {r[2]})"))
            elif r[3] not in states:
                out.append(FencedOut(tid, fence, f"the task is {r[3]}"))
            elif r[4] is None or r[4] < now:
                out.append(FencedOut(tid, fence, "the lease lapsed"))
            elif not expert_live:
                out.append(FencedOut(tid, fence, f"the lease of expert {expert} lapsed"))
            else:
                out.append(None)
                ok.append(n)
        if ok:
            apply(conn, now, ok)
        return out

    return run


async def start(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    def apply(conn: sqlite3.Connection, now: float, ok: list[int]) -> None:
        conn.executemany(
            "UPDATE tasks SET state = 'running', updated_at = ? WHERE id = ?",
            [(now, items[n][0]) for n in ok],
        )
        insert_events(conn, [(items[n][0], now, "started", items[n][1], expert, None) for n in ok])

    return await db.tx(_owner_write(db, expert, items, ("claimed",), apply))


async def checkpoint(db: Database, expert: str, task_id: str, fence: int, state_json: str) -> None:
    def apply(conn: sqlite3.Connection, now: float, ok: list[int]) -> None:
        conn.execute(
            "UPDATE tasks SET checkpoint = ?, updated_at = ? WHERE id = ?",
            (state_json, now, task_id),
        )

    (res,) = await db.tx(_owner_write(db, expert, [(task_id, fence)], OWNED, apply))
    if res is not None:
        raise res


async def complete(
    db: Database, expert: str, items: Sequence[Completion]
) -> list[FencedOut | None]:
    if not items:
        return []
    pairs = [(i.task_id, i.fence) for i in items]

    def apply(conn: sqlite3.Connection, now: float, ok: list[int]) -> None:
        conn.executemany(
            "UPDATE tasks SET state = 'succeeded', result = ?, owner = NULL, "
            "lease_deadline = NULL, updated_at = ? WHERE id = ?",
            [(items[n].result_json, now, items[n].task_id) for n in ok],
        )
        insert_events(
            conn, [(items[n].task_id, now, "succeeded", items[n].fence, expert, None) for n in ok]
        )
        settle_dependents(conn, now, [(items[n].task_id, "succeeded") for n in ok])

    out = await db.tx(_owner_write(db, expert, pairs, OWNED, apply))
    db.wakeups.touch()  # dependents may have become pending
    return out


async def fail(db: Database, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
    for item in items:
        check_retry_delay(item.retry_delay)
    if not items:
        return []
    pairs = [(i.task_id, i.fence) for i in items]

    def apply(conn: sqlite3.Connection, now: float, ok: list[int]) -> None:
        attempts = dict(
            conn.execute(
                f"SELECT id, attempts < max_attempts FROM tasks WHERE id IN ({','.join('?' * len(ok))})",
                [items[n].task_id for n in ok],
            ).fetchall()
        )
        settled = []
        for n in ok:
            item = items[n]
            if item.retry_delay is not None and attempts[item.task_id]:
                conn.execute(
                    "UPDATE tasks SET state = 'pending', error = ?, owner = NULL, "
                    "lease_deadline = NULL, run_at = ?, updated_at = ? WHERE id = ?",
                    (item.error_json, now + item.retry_delay, now, item.task_id),
                )
                insert_events(
                    conn,
                    [
                        (
                            item.task_id,
                            now,
                            "retry",
                            item.fence,
                            expert,
                            f"in {item.retry_delay:.3f}s",
                        )
                    ],
                )
            else:
                final = str(item.final_state if item.retry_delay is None else TaskState.DEAD)
                conn.execute(
                    "UPDATE tasks SET state = ?, error = ?, owner = NULL, lease_deadline = NULL, "
                    "updated_at = ? WHERE id = ?",
                    (final, item.error_json, now, item.task_id),
                )
                insert_events(conn, [(item.task_id, now, final, item.fence, expert, None)])
                settled.append((item.task_id, final))
        settle_dependents(conn, now, settled)

    out = await db.tx(_owner_write(db, expert, pairs, OWNED, apply))
    db.wakeups.touch()
    return out


async def release(
    db: Database, expert: str, items: Sequence[tuple[str, int]]
) -> list[FencedOut | None]:
    if not items:
        return []

    def apply(conn: sqlite3.Connection, now: float, ok: list[int]) -> None:
        conn.executemany(
            "UPDATE tasks SET state = 'pending', owner = NULL, lease_deadline = NULL, "
            "attempts = max(0, attempts - 1), updated_at = ? WHERE id = ?",
            [(now, items[n][0]) for n in ok],
        )
        insert_events(conn, [(items[n][0], now, "released", items[n][1], expert, None) for n in ok])

    out = await db.tx(_owner_write(db, expert, list(items), OWNED, apply))
    db.wakeups.touch()
    return out
