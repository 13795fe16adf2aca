"""The SQLite store's facade: :class:`SQLiteStore`, the :class:`~contend.store.port.Store`
that the parts of this package make up."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from contend.domain.scoring import TaskView
from contend.domain.task import (
    Capabilities,
    Requirements,
    Task,
    TaskEvent,
    TaskSpec,
    TaskState,
    aged_priority,
    can_move,
    next_promotion,
)
from contend.errors import (
    ExpertConflict,
    FencedOut,
    InvalidTransition,
    LeaseLost,
    StoreError,
    TaskNotFound,
)
from contend.store._common import (
    check_batch_dependencies,
    check_bid,
    check_limit,
    check_retry_delay,
    check_ttl,
    initial_state,
    rank_bids,
)
from contend.store.port import (
    Auction,
    Backlog,
    Claimed,
    Completion,
    ExpertInfo,
    ExpertRecord,
    Failure,
    Heartbeat,
    StoreStats,
    Submitted,
)
from contend.store.sqlite.connection import Database
from contend.store.sqlite.rows import (
    OWNED,
    TERMINAL,
    TERMINAL_BAD,
    chunks,
    claimed_from_row,
    dep_states,
    error_json,
    existing_ids,
    insert_events,
    load,
    req_json,
    row_to_task,
)
from contend.store.sqlite.schema import TASK_COLUMNS, prepare
from contend.store.sqlite.url import parse_sqlite_url, sync_pragma


class SQLiteStore:
    """A store in one SQLite file. One connection per instance; create one per process."""

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        busy_deadline: float = 30.0,
        idle_poll: float = 0.005,
    ) -> None:
        self.url = url
        self.path, opts = parse_sqlite_url(url)
        self._sync = sync_pragma(opts)
        self._db = Database(
            self.path, clock=clock, busy_deadline=busy_deadline, idle_poll=idle_poll
        )

    # -- connection ------------------------------------------------------------------------
    async def open(self) -> None:
        await self._db.open(lambda conn: prepare(conn, self.path, self._sync))

    async def close(self) -> None:
        await self._db.close()

    async def now(self) -> float:
        return self._db.clock()

    # -- submission and inspection ---------------------------------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        if not specs:
            return []

        def run(db: sqlite3.Connection) -> list[Submitted]:
            now = self._db.clock()
            keys = [s.key for s in specs if s.key is not None]
            existing: dict[str, str] = {}
            for chunk in chunks(keys, 500):
                marks = ",".join("?" * len(chunk))
                existing.update(
                    db.execute(
                        f"SELECT key, id FROM tasks WHERE key IN ({marks})", chunk
                    ).fetchall()
                )
            known = existing_ids(db, [s.id for s in specs])
            fresh: list[TaskSpec] = []
            out: list[Submitted] = []
            for spec in specs:
                if spec.id in known:  # the same spec sent again (a lost reply): keep the task
                    out.append(Submitted(spec.id, False))
                    continue
                if spec.key is not None and spec.key in existing:
                    out.append(Submitted(existing[spec.key], False))
                    continue
                if spec.key is not None:
                    existing[spec.key] = spec.id
                fresh.append(spec)
                out.append(Submitted(spec.id, True))
            check_batch_dependencies(fresh, lambda ids: existing_ids(db, ids))
            deps_state = dep_states(db, {d for s in fresh for d in s.depends_on})
            rows = []
            dep_rows: list[tuple[str, str]] = []
            for spec in fresh:
                left = [d for d in spec.depends_on if deps_state.get(d) not in TERMINAL]
                failed = [d for d in spec.depends_on if deps_state.get(d) in TERMINAL_BAD]
                state = initial_state(spec, len(left))
                error = None
                if failed:
                    state = TaskState.DEAD
                    error = error_json(
                        "DependencyFailed", f"dependency {failed[0]} did not succeed"
                    )
                rows.append(
                    (
                        spec.id,
                        spec.type,
                        spec.queue,
                        str(state),
                        spec.priority,
                        spec.args_json,
                        spec.kwargs_json,
                        spec.key,
                        req_json(spec.requirements),
                        spec.max_attempts,
                        now + spec.delay,
                        now,
                        now,
                        spec.timeout,
                        json.dumps(list(spec.depends_on)) if spec.depends_on else None,
                        len(left),
                        error,
                        spec.priority,
                        next_promotion(spec.priority, spec.priority, now),
                    )
                )
                dep_rows.extend((d, spec.id) for d in left)
            db.executemany(
                "INSERT INTO tasks (id, type, queue, state, priority, args, kwargs, key, "
                "requirements, max_attempts, run_at, created_at, updated_at, timeout, depends_on, "
                "deps_left, error, eff_priority, promote_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                rows,
            )
            if dep_rows:
                db.executemany("INSERT INTO task_deps (dep_id, task_id) VALUES (?, ?)", dep_rows)
            # A task dead at birth (a dependency had failed) fails batch members that wait on it.
            self._settle_dependents(db, now, [(r[0], r[3]) for r in rows if r[3] == "dead"])
            return out

        try:
            result = await self._db.tx(run)
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"submission refused by the database: {exc}") from exc
        self._db.wakeups.touch()
        return result

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        def run() -> Task:
            db = self._db.conn
            row = db.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            events: tuple[TaskEvent, ...] = ()
            if history:
                events = tuple(
                    TaskEvent(*e)
                    for e in db.execute(
                        "SELECT at, event, fence, expert, detail FROM task_events "
                        "WHERE task_id = ? ORDER BY rowid",
                        (task_id,),
                    )
                )
            return row_to_task(row, events)

        return await self._db.retry(run)

    async def list_tasks(
        self, *, state: TaskState | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Task]:
        check_limit(limit)
        where, params = [], []
        if state is not None:
            where.append("state = ?")
            params.append(str(TaskState(state)))
        if queue is not None:
            where.append("queue = ?")
            params.append(queue)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT {TASK_COLUMNS} FROM tasks {clause} ORDER BY id LIMIT ?"
        rows = await self._db.retry(lambda: self._db.conn.execute(sql, (*params, limit)).fetchall())
        return [row_to_task(r) for r in rows]

    async def stats(self) -> StoreStats:
        def run() -> tuple[float, dict[str, dict[str, int]], int, float | None]:
            db = self._db.conn
            now = self._db.clock()
            counts: dict[str, dict[str, int]] = {}
            for queue, state, n in db.execute(
                "SELECT queue, state, count(*) FROM tasks GROUP BY queue, state"
            ):
                counts.setdefault(queue, {})[state] = n
            done = db.execute(
                "SELECT count(*) FROM tasks WHERE state = 'succeeded' AND updated_at > ?",
                (now - 60,),
            ).fetchone()[0]
            oldest = db.execute(
                "SELECT min(run_at) FROM tasks WHERE state = 'pending' AND run_at <= ?", (now,)
            ).fetchone()[0]
            return now, counts, done, (None if oldest is None else now - oldest)

        now, counts, done, oldest = await self._db.retry(run)
        return StoreStats(now, counts, await self.list_experts(), done, oldest)

    async def list_experts(self) -> list[ExpertRecord]:
        rows = await self._db.retry(
            lambda: self._db.conn.execute(
                "SELECT id, session, info, lease_deadline, heartbeat_at, started_at, load, "
                "claim_attempts, claims_won, tasks_done, metrics FROM experts ORDER BY id"
            ).fetchall()
        )
        now = self._db.clock()
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

    # -- the claim protocol ----------------------------------------------------------------
    @staticmethod
    def _claimable_sql(queues: Sequence[str], with_ids: int | None, low_lane: bool = False) -> str:
        """A predicate on claimable tasks: the best by effective priority (parameters: queues,
        now, [ids], limit); with *low_lane*, or the oldest ones (more: queues, now, lane limit)."""
        qmarks = ",".join("?" * len(queues))
        ids = f" AND id IN ({','.join('?' * with_ids)})" if with_ids is not None else ""
        where = (
            f"state = 'pending' AND queue IN ({qmarks}) AND run_at <= ?{ids} "
            "AND (requirements IS NULL OR contend_fits(requirements))"
        )
        # INDEXED BY: left to itself the planner prefers the run_at range of tasks_oldest and
        # then sorts every pending task; walking the claim order's own index stops at LIMIT
        best = (
            f"SELECT id FROM tasks INDEXED BY tasks_claimable WHERE {where} "
            "ORDER BY eff_priority DESC, run_at, id LIMIT ?"
        )
        if not low_lane:
            return f"id IN ({best})"
        oldest = (
            f"SELECT id FROM tasks INDEXED BY tasks_oldest WHERE {where} "
            "ORDER BY run_at, id LIMIT ?"
        )
        # one IN over a compound query, so the outer statement looks ids up by key (an OR of
        # two INs would make SQLite scan the whole table)
        return f"id IN (SELECT id FROM ({best}) UNION SELECT id FROM ({oldest}))"

    async def peek(
        self, queues: Sequence[str], capabilities: Capabilities, limit: int, *, low_lane: int = 0
    ) -> list[TaskView]:
        check_limit(limit)
        if not queues or not limit:
            return []
        lane = min(low_lane, limit)
        params: tuple[Any, ...] = (*queues, self._db.clock(), limit - lane)
        if lane:
            params += (*queues, self._db.clock(), lane)

        def run() -> list[TaskView]:
            self._db.caps = capabilities
            inner = self._claimable_sql(queues, None, bool(lane))
            rows = self._db.conn.execute(
                f"SELECT id, type, queue, priority, requirements, created_at FROM tasks "
                f"WHERE {inner} ORDER BY eff_priority DESC, run_at, id",
                params,
            ).fetchall()
            return [
                TaskView(r[0], r[1], r[2], r[3], Requirements.from_json(load(r[4])), r[5])
                for r in rows
            ]

        return await self._db.retry(run)

    async def claim(
        self,
        expert: str,
        session: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
        task_ids: Sequence[str] | None = None,
        start: bool = True,
        low_lane: int = 0,
    ) -> list[Claimed]:
        check_limit(limit)
        ttl = check_ttl(lease_ttl)
        ids = list(dict.fromkeys(task_ids)) if task_ids is not None else None
        new_state = "running" if start else "claimed"

        def run(db: sqlite3.Connection) -> list[Claimed]:
            now = self._db.clock()
            self._check_session(db, expert, session, now)
            if not queues or not limit or (ids is not None and not ids):
                return []
            self._db.caps = capabilities
            lane = min(low_lane, limit) if ids is None else 0
            inner = self._claimable_sql(queues, None if ids is None else len(ids), bool(lane))
            params: tuple[Any, ...] = (*queues, now, *(ids or ()), limit - lane)
            if lane:
                params += (*queues, now, lane)
            rows = db.execute(
                f"UPDATE tasks SET state = ?, owner = ?, fence = fence + 1, "
                f"attempts = attempts + 1, lease_deadline = ?, updated_at = ? "
                f"WHERE {inner} "
                "RETURNING id, type, queue, args, kwargs, fence, attempts, max_attempts, "
                "checkpoint, timeout, priority",
                (new_state, expert, now + ttl, now, *params),
            ).fetchall()
            if rows:
                db.executemany(
                    "INSERT INTO task_events (task_id, at, event, fence, expert) VALUES (?,?,?,?,?)",
                    [(r[0], now, "claimed", r[5], expert) for r in rows],
                )
            return [claimed_from_row(r, now + ttl) for r in rows]

        return await self._db.tx(run)

    async def steal(
        self,
        thief: str,
        session: str,
        victim: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
    ) -> list[Claimed]:
        check_limit(limit)
        ttl = check_ttl(lease_ttl)
        if not queues or not limit:
            return []
        qmarks = ",".join("?" * len(queues))

        def run(db: sqlite3.Connection) -> list[Claimed]:
            now = self._db.clock()
            self._check_session(db, thief, session, now)
            self._db.caps = capabilities
            rows = db.execute(
                "UPDATE tasks SET state = 'running', owner = ?, fence = fence + 1, "
                "lease_deadline = ?, updated_at = ? WHERE id IN ("
                f"SELECT id FROM tasks WHERE owner = ? AND state = 'claimed' "
                f"AND lease_deadline >= ? AND queue IN ({qmarks}) "
                "AND (requirements IS NULL OR contend_fits(requirements)) "
                "ORDER BY eff_priority DESC, run_at, id LIMIT ?) "
                "RETURNING id, type, queue, args, kwargs, fence, attempts, max_attempts, "
                "checkpoint, timeout, priority",
                (thief, now + ttl, now, victim, now, *queues, limit),
            ).fetchall()
            insert_events(db, [(r[0], now, "stolen", r[5], thief, f"from {victim}") for r in rows])
            rows.sort(key=lambda r: -r[10])  # RETURNING keeps no order: best first
            return [claimed_from_row(r, now + ttl) for r in rows]

        return await self._db.tx(run)

    def _check_session(self, db: sqlite3.Connection, expert: str, session: str, now: float) -> None:
        row = db.execute(
            "SELECT session, lease_deadline FROM experts WHERE id = ?", (expert,)
        ).fetchone()
        if row is None or row[0] != session or row[1] < now:
            raise LeaseLost(f"expert {expert}: session {session} is not live")

    def _owner_write(
        self,
        expert: str,
        items: Sequence[tuple[str, int]],
        states: tuple[str, ...],
        apply: Callable[[sqlite3.Connection, float, list[int]], None],
    ) -> Callable[[sqlite3.Connection], list[FencedOut | None]]:
        """Check each (id, fence) against owner, fence, state and lease; call *apply* with the
        indexes that passed, inside the same transaction."""

        def run(db: sqlite3.Connection) -> list[FencedOut | None]:
            now = self._db.clock()
            found: dict[str, tuple[Any, ...]] = {}
            for chunk in chunks([i[0] for i in items], 500):
                marks = ",".join("?" * len(chunk))
                for r in db.execute(
                    f"SELECT id, fence, owner, state, lease_deadline FROM tasks WHERE id IN ({marks})",
                    chunk,
                ):
                    found[r[0]] = r
            lease = db.execute(
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
                apply(db, now, ok)
            return out

        return run

    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        def apply(db: sqlite3.Connection, now: float, ok: list[int]) -> None:
            db.executemany(
                "UPDATE tasks SET state = 'running', updated_at = ? WHERE id = ?",
                [(now, items[n][0]) for n in ok],
            )
            insert_events(
                db, [(items[n][0], now, "started", items[n][1], expert, None) for n in ok]
            )

        return await self._db.tx(self._owner_write(expert, items, ("claimed",), apply))

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        ttl = check_ttl(lease_ttl)

        def run(db: sqlite3.Connection) -> dict[str, int]:
            now = self._db.clock()
            self._check_session(db, expert, session, now)
            db.execute(
                "UPDATE experts SET lease_deadline = ?, heartbeat_at = ?, load = ?, "
                "claim_attempts = ?, claims_won = ?, tasks_done = ?, metrics = ? WHERE id = ?",
                (
                    now + ttl,
                    now,
                    beat.load,
                    beat.claim_attempts,
                    beat.claims_won,
                    beat.tasks_done,
                    json.dumps(dict(beat.metrics)),
                    expert,
                ),
            )
            rows = db.execute(
                "UPDATE tasks SET lease_deadline = ? WHERE owner = ? "
                "AND state IN ('claimed', 'running') AND lease_deadline >= ? RETURNING id, fence",
                (now + ttl, expert, now),
            ).fetchall()
            return dict(rows)

        return await self._db.tx(run)

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        def apply(db: sqlite3.Connection, now: float, ok: list[int]) -> None:
            db.execute(
                "UPDATE tasks SET checkpoint = ?, updated_at = ? WHERE id = ?",
                (state_json, now, task_id),
            )

        (res,) = await self._db.tx(self._owner_write(expert, [(task_id, fence)], OWNED, apply))
        if res is not None:
            raise res

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        if not items:
            return []
        pairs = [(i.task_id, i.fence) for i in items]

        def apply(db: sqlite3.Connection, now: float, ok: list[int]) -> None:
            db.executemany(
                "UPDATE tasks SET state = 'succeeded', result = ?, owner = NULL, "
                "lease_deadline = NULL, updated_at = ? WHERE id = ?",
                [(items[n].result_json, now, items[n].task_id) for n in ok],
            )
            insert_events(
                db, [(items[n].task_id, now, "succeeded", items[n].fence, expert, None) for n in ok]
            )
            self._settle_dependents(db, now, [(items[n].task_id, "succeeded") for n in ok])

        out = await self._db.tx(self._owner_write(expert, pairs, OWNED, apply))
        self._db.wakeups.touch()  # dependents may have become pending
        return out

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        for item in items:
            check_retry_delay(item.retry_delay)
        if not items:
            return []
        pairs = [(i.task_id, i.fence) for i in items]

        def apply(db: sqlite3.Connection, now: float, ok: list[int]) -> None:
            attempts = dict(
                db.execute(
                    f"SELECT id, attempts < max_attempts FROM tasks WHERE id IN ({','.join('?' * len(ok))})",
                    [items[n].task_id for n in ok],
                ).fetchall()
            )
            settled = []
            for n in ok:
                item = items[n]
                if item.retry_delay is not None and attempts[item.task_id]:
                    db.execute(
                        "UPDATE tasks SET state = 'pending', error = ?, owner = NULL, "
                        "lease_deadline = NULL, run_at = ?, updated_at = ? WHERE id = ?",
                        (item.error_json, now + item.retry_delay, now, item.task_id),
                    )
                    insert_events(
                        db,
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
                    db.execute(
                        "UPDATE tasks SET state = ?, error = ?, owner = NULL, lease_deadline = NULL, "
                        "updated_at = ? WHERE id = ?",
                        (final, item.error_json, now, item.task_id),
                    )
                    insert_events(db, [(item.task_id, now, final, item.fence, expert, None)])
                    settled.append((item.task_id, final))
            self._settle_dependents(db, now, settled)

        out = await self._db.tx(self._owner_write(expert, pairs, OWNED, apply))
        self._db.wakeups.touch()
        return out

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        if not items:
            return []

        def apply(db: sqlite3.Connection, now: float, ok: list[int]) -> None:
            db.executemany(
                "UPDATE tasks SET state = 'pending', owner = NULL, lease_deadline = NULL, "
                "attempts = max(0, attempts - 1), updated_at = ? WHERE id = ?",
                [(now, items[n][0]) for n in ok],
            )
            insert_events(
                db, [(items[n][0], now, "released", items[n][1], expert, None) for n in ok]
            )

        out = await self._db.tx(self._owner_write(expert, list(items), OWNED, apply))
        self._db.wakeups.touch()
        return out

    async def expire(self) -> int:
        def run(db: sqlite3.Connection) -> int:
            now = self._db.clock()
            lapsed = db.execute(
                "SELECT id, owner, fence, attempts < max_attempts FROM tasks "
                "WHERE state IN ('claimed', 'running') AND lease_deadline < ?",
                (now,),
            ).fetchall()
            if not lapsed:
                return 0
            db.executemany(
                "UPDATE tasks SET state = ?, error = coalesce(?, error), owner = NULL, "
                "lease_deadline = NULL, updated_at = ? WHERE id = ?",
                [
                    (
                        "pending" if r[3] else "dead",
                        None
                        if r[3]
                        else error_json(
                            "LeaseExpired", f"expert {r[1]} lost its lease on the last attempt"
                        ),
                        now,
                        r[0],
                    )
                    for r in lapsed
                ],
            )
            insert_events(db, [(r[0], now, "expired", r[2], r[1], None) for r in lapsed])
            self._settle_dependents(db, now, [(r[0], "dead") for r in lapsed if not r[3]])
            db.execute("DELETE FROM experts WHERE lease_deadline < ?", (now - 3600,))
            return len(lapsed)

        await self._clear_auctions()
        # A cheap read first: most calls find nothing to do and need no write lock.
        now = self._db.clock()
        due = await self._db.retry(
            lambda: self._db.conn.execute(
                "SELECT 1 FROM tasks WHERE state IN ('claimed', 'running') AND lease_deadline < ? LIMIT 1",
                (now,),
            ).fetchone()
        )
        moved = 0 if due is None else await self._db.tx(run)
        if moved:
            self._db.wakeups.touch()
        await self._age()  # after the lapse: returned tasks catch up on their ageing too
        return moved

    async def _age(self) -> None:
        """Ageing: raise the effective priority of pending tasks whose next step is due."""
        now = self._db.clock()
        due = await self._db.retry(
            lambda: self._db.conn.execute(
                "SELECT id, priority, created_at FROM tasks "
                "WHERE state = 'pending' AND promote_at <= ? LIMIT 5000",
                (now,),
            ).fetchall()
        )
        if not due:
            return
        updates = []
        for tid, priority, created in due:
            aged = aged_priority(priority, now - created)
            updates.append((aged, next_promotion(priority, aged, created), tid))

        def run(db: sqlite3.Connection) -> None:
            db.executemany(
                "UPDATE tasks SET eff_priority = ?, promote_at = ? "
                "WHERE id = ? AND state = 'pending'",
                updates,
            )

        await self._db.tx(run)

    async def _clear_auctions(self) -> None:
        """Drop auctions and bids of tasks that are no longer pending."""
        stale = await self._db.retry(
            lambda: self._db.conn.execute(
                "SELECT 1 FROM auctions a JOIN tasks t ON t.id = a.task_id "
                "WHERE t.state != 'pending' LIMIT 1"
            ).fetchone()
        )
        if stale is None:
            return

        def run(db: sqlite3.Connection) -> None:
            done = (
                "(SELECT a.task_id FROM auctions a JOIN tasks t ON t.id = a.task_id "
                "WHERE t.state != 'pending')"
            )
            db.execute(f"DELETE FROM bids WHERE task_id IN {done}")
            db.execute(f"DELETE FROM auctions WHERE task_id IN {done}")

        await self._db.tx(run)

    def _settle_dependents(
        self, db: sqlite3.Connection, now: float, done: list[tuple[str, str]]
    ) -> None:
        """Tasks in *done* reached a terminal state: wake their dependents (all deps
        succeeded) or kill them (a dep did not succeed), cascading."""
        todo = list(done)
        while todo:
            batch, todo = todo[:500], todo[500:]
            state_of = dict(batch)
            marks = ",".join("?" * len(batch))
            edges = db.execute(
                f"DELETE FROM task_deps WHERE dep_id IN ({marks}) RETURNING dep_id, task_id",
                [tid for tid, _ in batch],
            ).fetchall()
            for dep_id, dep_tid in sorted(edges):
                state = state_of[dep_id]
                if state == "succeeded":
                    db.execute(
                        "UPDATE tasks SET deps_left = deps_left - 1, "
                        "state = CASE WHEN deps_left = 1 THEN 'pending' ELSE state END, "
                        "run_at = CASE WHEN deps_left = 1 THEN max(run_at, ?) ELSE run_at END, "
                        "updated_at = ? WHERE id = ? AND state = 'waiting'",
                        (now, now, dep_tid),
                    )
                else:
                    hit = db.execute(
                        "UPDATE tasks SET state = 'dead', error = ?, updated_at = ? "
                        "WHERE id = ? AND state = 'waiting' RETURNING id",
                        (
                            error_json("DependencyFailed", f"dependency {dep_id} ended {state}"),
                            now,
                            dep_tid,
                        ),
                    ).fetchone()
                    if hit:
                        todo.append((dep_tid, "dead"))

    # -- management ------------------------------------------------------------------------
    async def _manage(
        self, task_id: str, target: TaskState, operation: str, allowed: Iterable[TaskState]
    ) -> Task:
        def run(db: sqlite3.Connection) -> None:
            now = self._db.clock()
            row = db.execute(
                "SELECT state, fence, owner FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            if TaskState(row[0]) not in allowed:
                raise InvalidTransition(task_id, row[0], operation)
            if target == TaskState.CANCELLED:
                db.execute(
                    "UPDATE tasks SET state = 'cancelled', owner = NULL, lease_deadline = NULL, "
                    "updated_at = ? WHERE id = ?",
                    (now, task_id),
                )
                db.execute("DELETE FROM task_deps WHERE task_id = ?", (task_id,))
                self._settle_dependents(db, now, [(task_id, "cancelled")])
            else:
                db.execute(
                    "UPDATE tasks SET state = 'pending', attempts = 0, run_at = ?, updated_at = ? "
                    "WHERE id = ?",
                    (now, now, task_id),
                )
            insert_events(
                db,
                [
                    (
                        task_id,
                        now,
                        "cancelled" if target == TaskState.CANCELLED else "retried",
                        row[1],
                        row[2],
                        None,
                    )
                ],
            )

        await self._db.tx(run)
        self._db.wakeups.touch()
        return await self.get(task_id)

    async def cancel(self, task_id: str) -> Task:
        allowed = [s for s in TaskState if can_move(s, TaskState.CANCELLED)]
        return await self._manage(task_id, TaskState.CANCELLED, "cancel", allowed)

    async def retry(self, task_id: str) -> Task:
        allowed = [TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED]
        return await self._manage(task_id, TaskState.PENDING, "retry", allowed)

    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        ttl = check_ttl(lease_ttl)
        session = uuid.uuid4().hex

        def run(db: sqlite3.Connection) -> None:
            now = self._db.clock()
            row = db.execute(
                "SELECT info, lease_deadline FROM experts WHERE id = ?", (info.id,)
            ).fetchone()
            if row is not None and row[1] >= now:
                other = ExpertInfo.from_json_text(row[0])
                raise ExpertConflict(
                    f"expert id {info.id!r} is live elsewhere (host {other.host or '?'}, pid "
                    f"{other.pid}); pick another --name or stop that expert"
                )
            if row is not None:
                # The old session's claims end with it: a new session never inherits them.
                db.execute(
                    "UPDATE tasks SET lease_deadline = min(lease_deadline, ?) "
                    "WHERE owner = ? AND state IN ('claimed', 'running')",
                    (row[1], info.id),
                )
            db.execute(
                "INSERT OR REPLACE INTO experts (id, session, info, lease_deadline, heartbeat_at, "
                "started_at) VALUES (?, ?, ?, ?, ?, ?)",
                (info.id, session, info.to_json_text(), now + ttl, now, now),
            )

        await self._db.tx(run)
        return session

    async def deregister_expert(self, expert: str, session: str) -> None:
        def run(db: sqlite3.Connection) -> None:
            now = self._db.clock()
            db.execute(
                "UPDATE experts SET lease_deadline = min(lease_deadline, ?), load = 0 "
                "WHERE id = ? AND session = ?",
                (now - 1e-6, expert, session),
            )

        await self._db.tx(run)

    # -- wake-ups --------------------------------------------------------------------------
    async def wait_for_change(self, timeout: float) -> None:
        await self._db.wakeups.wait_for_change(self._db.conn, timeout)

    async def bid(
        self, expert: str, session: str, task_id: str, score: float, window: float
    ) -> Auction:
        score, window = check_bid(score, window)

        def run(db: sqlite3.Connection) -> Auction:
            now = self._db.clock()
            self._check_session(db, expert, session, now)
            row = db.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            db.execute(
                "INSERT INTO auctions (task_id, closes_at) VALUES (?, ?) "
                "ON CONFLICT (task_id) DO NOTHING",
                (task_id, now + window),
            )
            closes = db.execute(
                "SELECT closes_at FROM auctions WHERE task_id = ?", (task_id,)
            ).fetchone()[0]
            if row[0] != "pending":
                return Auction(task_id, now, closes, (), open=False)
            db.execute(
                "INSERT INTO bids (task_id, expert, score, at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (task_id, expert) DO UPDATE SET score = excluded.score",
                (task_id, expert, score, now),
            )
            bids = {
                r[0]: (r[1], r[2])
                for r in db.execute(
                    "SELECT expert, score, at FROM bids WHERE task_id = ?", (task_id,)
                )
            }
            return Auction(task_id, now, closes, rank_bids(bids))

        return await self._db.tx(run)

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        if not queues:
            return Backlog(0, None)
        marks = ",".join("?" * len(queues))
        now = self._db.clock()
        row = await self._db.retry(
            lambda: self._db.conn.execute(
                f"SELECT count(*), min(run_at) FROM tasks WHERE state = 'pending' "
                f"AND queue IN ({marks}) AND run_at <= ?",
                (*queues, now),
            ).fetchone()
        )
        return Backlog(row[0], None if row[1] is None else now - row[1])

    async def next_due(self, queues: Sequence[str]) -> float | None:
        if not queues:
            return None
        marks = ",".join("?" * len(queues))
        row = await self._db.retry(
            lambda: self._db.conn.execute(
                f"SELECT min(run_at) FROM tasks WHERE state = 'pending' AND queue IN ({marks})",
                tuple(queues),
            ).fetchone()
        )
        return None if row is None else row[0]
