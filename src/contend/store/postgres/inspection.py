"""Reading without changing: one task (with its history), lists, statistics, the experts, the
backlog of some queues and when their next task is due."""

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
from contend.store.postgres.database import Cursor, Database, one
from contend.store.postgres.rows import NOT_CLAIMED, TASK_COLUMNS


async def get(db: Database, task_id: str, *, history: bool = False) -> Task:
    async def run(cur: Cursor) -> Task:
        await cur.execute(
            db.sql(f"SELECT {TASK_COLUMNS} FROM {{s}}.tasks WHERE id = %s"), (task_id,)
        )
        row = await cur.fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        events: tuple[TaskEvent, ...] = ()
        if history:
            await cur.execute(
                db.sql(
                    "SELECT at, event, fence, expert, detail FROM {s}.task_events "
                    "WHERE task_id = %s ORDER BY seq"
                ),
                (task_id,),
            )
            events = tuple(TaskEvent(*e) for e in await cur.fetchall())
        return task_from_row(row, events)

    return await db.run(run, tx=history)


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
    clause, params = task_filter(state, queue, type, "%s")
    order = "id DESC" if newest else "id"
    sql = db.sql(f"SELECT {TASK_COLUMNS} FROM {{s}}.tasks {clause} ORDER BY {order} LIMIT %s")

    async def run(cur: Cursor) -> list[Task]:
        await cur.execute(sql, (*params, limit))
        return [task_from_row(r) for r in await cur.fetchall()]

    return await db.run(run, tx=False)


async def dependants(db: Database, task_id: str, *, limit: int = 100) -> list[Task]:
    """A scan: no index names a task's dependants once its edges (``task_deps``) are gone."""
    check_limit(limit)
    sql = db.sql(
        f"SELECT {TASK_COLUMNS} FROM {{s}}.tasks WHERE %s = ANY(depends_on) ORDER BY id LIMIT %s"
    )

    async def run(cur: Cursor) -> list[Task]:
        await cur.execute(sql, (task_id, limit))
        return [task_from_row(r) for r in await cur.fetchall()]

    return await db.run(run, tx=False)


async def ids_with_prefix(db: Database, prefix: str, *, limit: int = 10) -> list[str]:
    """A range of the primary key (``id >= %s AND id < %s``: an index scan, whatever the
    database's collation, as hex ids sort alike in all of them; a ``LIKE`` would need the C
    collation or ``text_pattern_ops`` to use the index), ids only."""
    check_id_prefix(prefix)
    check_limit(limit)
    bound = prefix_bound(prefix)
    where = "id >= %s" + (" AND id < %s" if bound else "")
    sql = db.sql(f"SELECT id FROM {{s}}.tasks WHERE {where} ORDER BY id LIMIT %s")
    params = (prefix, bound, limit) if bound else (prefix, limit)

    async def run(cur: Cursor) -> list[str]:
        await cur.execute(sql, params)
        return [r[0] for r in await cur.fetchall() if r[0].startswith(prefix)]

    return await db.run(run, tx=False)


#: Each of ``%(keys)s`` (distinct): its claimed and running tasks, counted on
#: ``tasks_limited`` (its ``IS NOT NULL`` repeated: no planner has to prove it), and its
#: rate and GCRA state from ``rate_keys`` (NULL: none). One statement, one snapshot.
KEY_STATES = (
    "SELECT k.key, coalesce(h.n, 0), r.interval, r.burst, r.tat"
    " FROM unnest(%(keys)s::text[]) AS k(key)"
    " LEFT JOIN (SELECT limit_key, count(*) AS n FROM {s}.tasks"
    "  WHERE limit_key = ANY(%(keys)s) AND limit_key IS NOT NULL"
    "   AND state IN ('claimed', 'running') GROUP BY limit_key) h ON h.limit_key = k.key"
    " LEFT JOIN {s}.rate_keys r ON r.key = k.key"
)


async def key_states(db: Database, keys: Collection[str]) -> dict[str, KeyState]:
    """Every key of *keys* in the answer (``KeyState()`` for one with no held task and no
    rate); no keys, no statement."""
    wanted = list(dict.fromkeys(keys))
    if not wanted:
        return {}
    sql = db.sql(KEY_STATES)

    async def run(cur: Cursor) -> dict[str, KeyState]:
        await cur.execute(sql, {"keys": wanted})
        return {
            key: KeyState(int(n), None if interval is None else Rate(interval, burst), tat)
            for key, n, interval, burst, tat in await cur.fetchall()
        }

    return await db.run(run, tx=False)


async def stats(db: Database) -> StoreStats:
    async def run(
        cur: Cursor,
    ) -> tuple[float, dict[str, dict[str, int]], dict[str, int], float | None]:
        await cur.execute(
            db.sql(
                "SELECT {now}, "
                "(SELECT min(run_at) FROM {s}.tasks WHERE state = 'pending' "
                f" AND {NOT_CLAIMED.format(t='')} AND run_at <= {{now}})"
            ),
            db.params(),
        )
        now, oldest = one(await cur.fetchone())
        await cur.execute(
            db.sql(
                "SELECT queue, count(*) FROM {s}.tasks WHERE state = 'succeeded' "
                "AND updated_at > {now} - 60 GROUP BY queue"
            ),
            db.params(),
        )
        done = {queue: int(n) for queue, n in await cur.fetchall()}
        await cur.execute(
            db.sql("SELECT queue, state, count(*) FROM {s}.tasks GROUP BY queue, state")
        )
        counts: dict[str, dict[str, int]] = {}
        for queue, state, n in await cur.fetchall():
            counts.setdefault(queue, {})[state] = int(n)
        return now, counts, done, (None if oldest is None else now - oldest)

    now, counts, done, oldest = await db.run(run)
    experts = await list_experts(db)
    return StoreStats(now, counts, experts, sum(done.values()), oldest, done)


async def list_experts(db: Database) -> list[ExpertRecord]:
    async def run(cur: Cursor) -> list[ExpertRecord]:
        await cur.execute(
            db.sql(
                "SELECT id, session, info, lease_deadline, heartbeat_at, started_at, load, "
                "claim_attempts, claims_won, tasks_done, lease_deadline >= {now}, metrics "
                "FROM {s}.experts ORDER BY id"
            ),
            db.params(),
        )
        return [
            ExpertRecord(
                info=ExpertInfo.from_json_text(r[2]),
                session=r[1],
                alive=r[10],
                load=r[6],
                lease_deadline=r[3],
                heartbeat_at=r[4],
                started_at=r[5],
                claim_attempts=r[7],
                claims_won=r[8],
                tasks_done=r[9],
                metrics=json.loads(r[11]),
            )
            for r in await cur.fetchall()
        ]

    return await db.run(run, tx=False)


async def backlog(db: Database, queues: Sequence[str]) -> Backlog:
    async def run(cur: Cursor) -> Backlog:
        await cur.execute(
            db.sql(
                "SELECT {now}, count(*), min(run_at) FROM {s}.tasks WHERE state = 'pending' "
                f"AND {NOT_CLAIMED.format(t='')} AND queue = ANY(%(queues)s) AND run_at <= {{now}}"
            ),
            db.params(queues=list(queues)),
        )
        now, n, oldest = one(await cur.fetchone())
        return Backlog(int(n), None if oldest is None else now - oldest)

    return await db.run(run, tx=False)


async def next_due(db: Database, queues: Sequence[str], *, later: bool = False) -> float | None:
    """*later*: only tasks due after now, a seek in ``tasks_oldest`` past the entries of the
    tasks claimed since vacuum last could remove them (they were due when claimed).

    One arm per queue, each ordered by the index's own columns: with ``queue = ANY(array)``
    the planner may walk ``tasks_claimable`` instead and read every entry of the queue (in the
    5-minute hold of the sustained run, this read took most of the server's time)."""
    distinct = list(dict.fromkeys(queues))
    if not distinct:
        return None
    after = " AND run_at > {now}" if later else ""

    def build() -> str:
        arms = " UNION ALL ".join(
            f"(SELECT run_at FROM {{s}}.tasks WHERE state = 'pending' AND queue = %(q{n})s"
            f" AND {NOT_CLAIMED.format(t='')}{after}"
            " ORDER BY run_at LIMIT 1)"
            for n in range(len(distinct))
        )
        return db.sql(f"SELECT min(r) FROM ({arms}) u(r)")

    sql = db.text(("next_due", len(distinct), later), build)

    async def run(cur: Cursor) -> float | None:
        await cur.execute(sql, db.params(**{f"q{n}": q for n, q in enumerate(distinct)}))
        row = await cur.fetchone()
        return None if row is None else row[0]

    return await db.run(run, tx=False)
