"""Submission: insert a batch of tasks, deduplicated by id and idempotency key, with their
dependency edges, in one transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from contend.domain import transitions as rules
from contend.domain.task import TaskSpec, TaskState, unaged
from contend.errors import StoreError
from contend.store._common import check_batch_dependencies, sort_out
from contend.store.port import Submitted
from contend.store.sqlite.connection import Database
from contend.store.sqlite.outcomes import settle_dependants
from contend.store.sqlite.rows import (
    EventRow,
    chunks,
    dep_states,
    existing_ids,
    insert_events,
    req_json,
)


async def submit(db: Database, specs: Sequence[TaskSpec]) -> list[Submitted]:
    if not specs:
        return []

    def run(conn: sqlite3.Connection) -> list[Submitted]:
        now = db.clock()
        fresh, out = _sort_out(conn, specs)
        check_batch_dependencies(fresh, lambda ids: existing_ids(conn, ids))
        _insert(conn, now, fresh)
        return out

    try:
        result = await db.tx(run)
    except sqlite3.IntegrityError as exc:
        raise StoreError(f"submission refused by the database: {exc}") from exc
    db.wakeups.touch()
    return result


def _sort_out(
    conn: sqlite3.Connection, specs: Sequence[TaskSpec]
) -> tuple[list[TaskSpec], list[Submitted]]:
    """The specs to insert, and the answer for each spec: a task already known by its id (the
    same spec sent again after a lost reply) or by its idempotency key is kept, not made."""
    keys = [s.key for s in specs if s.key is not None]
    existing: dict[str, str] = {}
    for chunk in chunks(keys, 500):
        marks = ",".join("?" * len(chunk))
        existing.update(
            conn.execute(f"SELECT key, id FROM tasks WHERE key IN ({marks})", chunk).fetchall()
        )
    known = existing_ids(conn, [s.id for s in specs])
    return sort_out(specs, known, existing)


def _insert(conn: sqlite3.Connection, now: float, fresh: list[TaskSpec]) -> None:
    """Insert the task rows, each in the state the rulebook gives a new task, and the
    dependency edges still open."""
    deps_state = dep_states(conn, {d for s in fresh for d in s.depends_on})
    free = rules.submitted((), {})  # the birth of every task without dependencies
    rows = []
    dep_rows: list[tuple[str, str]] = []
    born_dead: list[tuple[str, TaskState]] = []
    events: list[EventRow] = []
    for spec in fresh:
        birth = (
            rules.submitted(spec.depends_on, deps_state, spec.if_failed)
            if spec.depends_on
            else free
        )
        if birth.state.terminal:
            born_dead.append((spec.id, birth.state))
        if birth.event is not None:
            events.append((spec.id, now, birth.event, 0, None, birth.detail or ""))
        rows.append(
            (
                spec.id,
                spec.type,
                spec.queue,
                birth.state,
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
                len(birth.waits_on),
                birth.error_json,
                *unaged(spec.priority, now + spec.delay),
                spec.trace,
                spec.limit_key,
                spec.concurrency_limit,
                int(spec.central),
                json.dumps(list(spec.if_failed)) if spec.if_failed else None,
                None if spec.rate_limit is None else spec.rate_limit.interval,
                None if spec.rate_limit is None else spec.rate_limit.burst,
                spec.limit_key if spec.fair else None,
            )
        )
        dep_rows.extend((d, spec.id) for d in birth.waits_on)
    conn.executemany(
        "INSERT INTO tasks (id, type, queue, state, priority, args, kwargs, key, "
        "requirements, max_attempts, run_at, created_at, updated_at, timeout, depends_on, "
        "deps_left, error, eff_priority, promote_at, trace, limit_key, limit_max, central, "
        "if_failed, rate_interval, rate_burst, fair_key) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    if any(s.priority != 0 for s in fresh):  # ageing is written from now on (housekeeping)
        conn.execute("INSERT OR IGNORE INTO contend_meta VALUES ('levels', '1')")
    rates = {s.limit_key: s.rate_limit for s in fresh if s.rate_limit and s.limit_key}
    if rates:
        # a key's rate is the one its latest submission declared; its state (tat) stays
        conn.executemany(
            "INSERT INTO rate_keys (key, interval, burst) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET interval = excluded.interval, "
            "burst = excluded.burst, full_until = tat - (excluded.burst - 1) * excluded.interval",
            [(k, r.interval, r.burst) for k, r in rates.items()],
        )
    insert_events(conn, events)
    if dep_rows:
        conn.executemany("INSERT INTO task_deps (dep_id, task_id) VALUES (?, ?)", dep_rows)
    # A task dead at birth (a dependency had failed) settles batch members that wait on it.
    settle_dependants(conn, now, born_dead)
