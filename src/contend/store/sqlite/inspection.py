"""Inspection: read tasks, experts, counts and backlogs without taking the write lock."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

from contend.domain.ids import check_id_prefix, prefix_bound
from contend.domain.limits import KeyState, Rate
from contend.domain.task import Task, TaskEvent, TaskState
from contend.errors import TaskNotFound
from contend.store._common import check_limit
from contend.store._sql import task_filter, task_from_row
from contend.store.port import Backlog, ExpertInfo, ExpertRecord, StoreStats
from contend.store.sqlite.connection import Database
from contend.store.sqlite.schema import TASK_COLUMNS

#: ``list_tasks`` with a filter first reads this many tasks in the order asked (at least; or
#: LIST_WINDOW_FACTOR times its limit) for the ones that match.
LIST_WINDOW = 1000
LIST_WINDOW_FACTOR = 20


async def get(db: Database, task_id: str, *, history: bool = False) -> Task:
    def run() -> Task:
        conn = db.conn
        row = conn.execute(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        events: tuple[TaskEvent, ...] = ()
        if history:
            events = tuple(
                TaskEvent(*e)
                for e in conn.execute(
                    "SELECT at, event, fence, expert, detail FROM task_events "
                    "WHERE task_id = ? ORDER BY rowid",
                    (task_id,),
                )
            )
        return task_from_row(row, events, text_json=True)

    return await db.retry(run)


async def list_tasks(
    db: Database,
    *,
    state: TaskState | None = None,
    queue: str | None = None,
    type: str | None = None,
    newest: bool = False,
    limit: int = 100,
) -> list[Task]:
    check_limit(limit)
    clause, params = task_filter(state, queue, type, "?")
    order = "id DESC" if newest else "id"
    sql = f"SELECT {TASK_COLUMNS} FROM tasks {clause} ORDER BY {order} LIMIT ?"
    rows = []
    if clause and limit:
        # A filter on a common state (the dashboard's succeeded tasks, newest first) went by
        # the state index, and SQLite sorted every task in that state to give the first few:
        # 194 ms behind 200,000. First look among the first ids in the order asked: when
        # *limit* of them match, they are the answer (every task past them comes later).
        window = max(LIST_WINDOW, LIST_WINDOW_FACTOR * limit)
        first = (
            f"SELECT {TASK_COLUMNS} FROM (SELECT * FROM tasks ORDER BY {order} LIMIT ?) "
            f"{clause} ORDER BY {order} LIMIT ?"
        )
        rows = await db.retry(lambda: db.conn.execute(first, (window, *params, limit)).fetchall())
    if len(rows) < limit:  # a rarer state: by its index, and sorted
        rows = await db.retry(lambda: db.conn.execute(sql, (*params, limit)).fetchall())
    return [task_from_row(r, text_json=True) for r in rows]


async def dependants(db: Database, task_id: str, *, limit: int = 100) -> list[Task]:
    """A scan of the tasks that have dependencies (no index names a task's dependants once
    the edges are gone); ``instr`` skips most rows before their JSON is parsed."""
    check_limit(limit)
    sql = (
        f"SELECT {TASK_COLUMNS} FROM tasks WHERE depends_on IS NOT NULL "
        "AND instr(depends_on, ?) > 0 "
        "AND EXISTS (SELECT 1 FROM json_each(tasks.depends_on) WHERE value = ?) "
        "ORDER BY id LIMIT ?"
    )
    needle = json.dumps(task_id)[1:-1]
    rows = await db.retry(lambda: db.conn.execute(sql, (needle, task_id, limit)).fetchall())
    return [task_from_row(r, text_json=True) for r in rows]


async def ids_with_prefix(db: Database, prefix: str, *, limit: int = 10) -> list[str]:
    """A range of the primary key (``id >= ? AND id < ?``, which SQLite's index answers; a
    ``LIKE`` would scan the table), ids only."""
    check_id_prefix(prefix)
    check_limit(limit)
    bound = prefix_bound(prefix)
    sql = "SELECT id FROM tasks WHERE id >= ?" + (" AND id < ?" if bound else "")
    params = (prefix, bound, limit) if bound else (prefix, limit)
    rows = await db.retry(lambda: db.conn.execute(sql + " ORDER BY id LIMIT ?", params).fetchall())
    return [r[0] for r in rows if r[0].startswith(prefix)]


async def key_states(db: Database, keys: Collection[str]) -> dict[str, KeyState]:
    """Held tasks counted on ``tasks_limited`` (claimed and running only), rates from
    ``rate_keys``, a batch of keys a statement."""
    wanted = list(dict.fromkeys(keys))
    out = {k: KeyState() for k in wanted}

    def read() -> None:
        for first in range(0, len(wanted), 500):
            batch = wanted[first : first + 500]
            marks = ",".join("?" * len(batch))
            held = dict(
                db.conn.execute(
                    f"SELECT limit_key, count(*) FROM tasks INDEXED BY tasks_limited "
                    f"WHERE limit_key IN ({marks}) AND state IN ('claimed', 'running') "
                    "GROUP BY limit_key",
                    batch,
                ).fetchall()
            )
            rates = {
                key: (Rate(interval, burst), tat)
                for key, interval, burst, tat in db.conn.execute(
                    f"SELECT key, interval, burst, tat FROM rate_keys WHERE key IN ({marks})",
                    batch,
                )
            }
            for key in batch:
                rate, tat = rates.get(key, (None, None))
                out[key] = KeyState(held.get(key, 0), rate, tat)

    await db.retry(read)
    return out


async def stats(db: Database) -> StoreStats:
    def run() -> tuple[float, dict[str, dict[str, int]], dict[str, int], float | None]:
        conn = db.conn
        now = db.clock()
        counts: dict[str, dict[str, int]] = {}
        for queue, state, n in conn.execute(
            "SELECT queue, state, count(*) FROM tasks GROUP BY queue, state"
        ):
            counts.setdefault(queue, {})[state] = n
        # The counts read every task once (the state index, covering). The last minute's
        # successes and the oldest due task are read by their own indexes: SQLite's own choice,
        # the state index, read every succeeded task and every pending one from the table, as
        # much again as the counts (a dashboard or metrics scrape of a large store pays it).
        done = dict(
            conn.execute(
                "SELECT queue, count(*) FROM tasks INDEXED BY tasks_done "
                "WHERE state = 'succeeded' AND updated_at > ? GROUP BY queue",
                (now - 60,),
            ).fetchall()
        )
        due = [
            conn.execute(
                "SELECT min(run_at) FROM tasks INDEXED BY tasks_oldest "
                "WHERE state = 'pending' AND queue = ? AND run_at <= ?",
                (queue, now),
            ).fetchone()[0]
            for queue, n in counts.items()
            if n.get("pending")
        ]
        oldest = min((t for t in due if t is not None), default=None)
        return now, counts, done, (None if oldest is None else now - oldest)

    now, counts, done, oldest = await db.retry(run)
    experts = await list_experts(db)
    return StoreStats(now, counts, experts, sum(done.values()), oldest, done)


async def list_experts(db: Database) -> list[ExpertRecord]:
    rows = await db.retry(
        lambda: db.conn.execute(
            "SELECT id, session, info, lease_deadline, heartbeat_at, started_at, load, "
            "claim_attempts, claims_won, tasks_done, metrics FROM experts ORDER BY id"
        ).fetchall()
    )
    now = db.clock()
    return [
        ExpertRecord(
            info=ExpertInfo.from_json_text(r[2]),
            session=r[1],
            alive=r[3] >= now,
            load=r[6],
            lease_deadline=r[3],
            heartbeat_at=r[4],
            started_at=r[5],
            claim_attempts=r[7],
            claims_won=r[8],
            tasks_done=r[9],
            metrics=json.loads(r[10]),
        )
        for r in rows
    ]


async def backlog(db: Database, queues: Sequence[str]) -> Backlog:
    if not queues:
        return Backlog(0, None)
    marks = ",".join("?" * len(queues))
    now = db.clock()
    row = await db.retry(
        lambda: db.conn.execute(
            f"SELECT count(*), min(run_at) FROM tasks WHERE state = 'pending' "
            f"AND queue IN ({marks}) AND run_at <= ?",
            (*queues, now),
        ).fetchone()
    )
    return Backlog(row[0], None if row[1] is None else now - row[1])


async def next_due(db: Database, queues: Sequence[str], *, later: bool = False) -> float | None:
    if not queues:
        return None
    marks = ",".join("?" * len(queues))
    row = await db.retry(
        lambda: db.conn.execute(
            f"SELECT min(run_at) FROM tasks WHERE state = 'pending' AND queue IN ({marks})",
            tuple(queues),
        ).fetchone()
    )
    return None if row is None else row[0]
