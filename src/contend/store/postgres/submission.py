"""Submission: new tasks, their dependency edges and the wake-up, in one statement.

A batch with keys or dependencies first reads, in the same transaction, the ids and keys it
may repeat and the states of the dependencies it names (those rows held ``FOR SHARE``, so that
a dependency cannot finish unseen before the batch commits)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg.errors

from contend.domain import transitions as rules
from contend.domain.task import TaskSpec, TaskState, next_promotion
from contend.errors import StoreError
from contend.store._common import check_batch_dependencies, refuse_limits, sort_out
from contend.store.port import Promises, Submitted
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.rows import req_json

# submit's unnest arrays: name -> element type
_SUBMIT_COLUMNS = {
    "id": "text",
    "type": "text",
    "queue": "text",
    "state": "text",
    "priority": "int",
    "args": "text",
    "kwargs": "text",
    "key": "text",
    "req": "text",
    "max_attempts": "int",
    "delay": "float8",
    "timeout": "float8",
    "deps": "text",
    "deps_left": "int",
    "error": "text",
    "promote_in": "float8",
    "trace": "text",
    "if_failed": "text",
    "limit_key": "text",
    "limit_max": "int",
    "rate_interval": "float8",
    "rate_burst": "int",
    "fair_key": "text",
    "central": "bool",
    "born_event": "text",
    "born_detail": "text",
}

#: What this backend keeps (``Store.promises``); submit refuses what it does not.
PROMISES = Promises(
    transactions=True,
    concurrency_limits=True,
    rate_limits=True,
    fair_share=True,
    central_dispatch=True,
)


async def submit(db: Database, specs: Sequence[TaskSpec]) -> list[Submitted]:
    if not specs:
        return []
    refuse_limits(specs, "PostgreSQL", PROMISES)
    # A batch with no keys and no dependencies reads nothing first: its one statement is
    # atomic on its own, without the round trips of an explicit transaction.
    simple = all(s.key is None and not s.depends_on for s in specs)

    async def run(cur: Cursor) -> list[Submitted]:
        fresh, out = await _new_specs(db, cur, specs, simple)
        states = await _dependency_states(db, cur, fresh)
        check_batch_dependencies(fresh, lambda ids: {i for i in ids if i in states})
        if not fresh:
            return out
        cols, dep_rows = _columns(fresh, states)
        features = _features(fresh)
        await cur.execute(
            db.text(("submit", bool(features)), lambda: _submit_sql(db, bool(features))),
            db.params(
                **cols,
                dep_ids=[d for d, _ in dep_rows],
                dep_tasks=[t for _, t in dep_rows],
                channel=db.channel,
                features=features,
            ),
        )
        inserted = {r[0] for r in await cur.fetchall()}
        # an id already there (only a simple batch gets this far with one): sent again
        return [Submitted(o.id, o.created and o.id in inserted) for o in out]

    for attempt in range(3):
        try:
            return await db.run(run, tx=not simple)
        except StoreError as exc:
            cause = exc.__cause__
            if not isinstance(cause, psycopg.errors.UniqueViolation):
                raise
            if cause.diag.constraint_name == "tasks_key_key" and attempt < 2:
                continue  # another submitter inserted the same key: read it this time
            raise StoreError(f"submission refused by the database: {cause}") from cause
    raise AssertionError("unreachable")


async def _new_specs(
    db: Database, cur: Cursor, specs: Sequence[TaskSpec], simple: bool
) -> tuple[list[TaskSpec], list[Submitted]]:
    """The specs to insert, and the answer for every spec: a spec sent again, or with a key
    already taken, names the task that is there."""
    known: set[str] = set()
    if not simple:
        await cur.execute(
            db.sql("SELECT id FROM {s}.tasks WHERE id = ANY(%s)"),
            ([s.id for s in specs],),
        )
        known = {r[0] for r in await cur.fetchall()}
    keys = [s.key for s in specs if s.key is not None]
    existing: dict[str, str] = {}
    if keys:
        await cur.execute(db.sql("SELECT key, id FROM {s}.tasks WHERE key = ANY(%s)"), (keys,))
        existing.update((r[0], r[1]) for r in await cur.fetchall())
    return sort_out(specs, known, existing)


async def _dependency_states(db: Database, cur: Cursor, fresh: list[TaskSpec]) -> dict[str, str]:
    deps = sorted({d for s in fresh for d in s.depends_on})
    states: dict[str, str] = {}
    if deps:
        # FOR SHARE: a dependency cannot finish (and miss our task_deps rows) until we commit.
        await cur.execute(
            db.sql("SELECT id, state FROM {s}.tasks WHERE id = ANY(%s) ORDER BY id FOR SHARE"),
            (deps,),
        )
        states = {r[0]: r[1] for r in await cur.fetchall()}
    return states


def _columns(
    fresh: list[TaskSpec], states: dict[str, str]
) -> tuple[dict[str, list[Any]], list[tuple[str, str]]]:
    """The insert's unnest arrays, and the dependency edges (dependency, dependant) still
    open. *states* gains the state of every new task."""
    cols: dict[str, list[Any]] = {name: [] for name in _SUBMIT_COLUMNS}
    dep_rows: list[tuple[str, str]] = []
    # Dependencies before their dependents, so that a task depending on one made dead
    # in this same batch (its own dependency had failed) is dead too, not left waiting
    # for a task that will never finish.
    for spec in _dependencies_first(fresh):
        known = {d: TaskState(states[d]) for d in spec.depends_on if d in states}
        birth = rules.submitted(spec.depends_on, known, spec.if_failed)
        state, error, left = birth.state, birth.error_json, birth.waits_on
        row = (
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
            spec.delay,
            spec.timeout,
            json.dumps(list(spec.depends_on)) if spec.depends_on else None,
            len(left),
            error,
            next_promotion(spec.priority, spec.priority, 0.0),  # after creation
            spec.trace,
            json.dumps(list(spec.if_failed)) if spec.if_failed else None,
            spec.limit_key,
            spec.concurrency_limit,
            None if spec.rate_limit is None else spec.rate_limit.interval,
            None if spec.rate_limit is None else spec.rate_limit.burst,
            spec.limit_key if spec.fair else None,
            spec.central,
            None if birth.event is None else str(birth.event),
            birth.detail,
        )
        for name, value in zip(_SUBMIT_COLUMNS, row, strict=True):
            cols[name].append(value)
        states[spec.id] = str(state)
        dep_rows.extend((d, spec.id) for d in left)
    return cols, dep_rows


def _features(specs: Sequence[TaskSpec]) -> list[str]:
    """The features (``features`` table, migration 12) these tasks use: a store that has one
    claims with the whole statement (``claims.claim``)."""
    used = set()
    for spec in specs:
        if spec.central:
            used.add("central")
        if spec.limit_key is not None:
            used.add("limits")
        if spec.fair:
            used.add("fair")
    return sorted(used)


def _submit_sql(db: Database, features: bool) -> str:
    # one statement: the tasks, the history line of those that end at birth, their dependency
    # edges, the features they use (in the same statement, so that no claim sees the tasks
    # without them) and the notification
    types = ", ".join(f"%({n})s::{t}[]" for n, t in _SUBMIT_COLUMNS.items())
    marked = (
        "), marked AS ("
        "  INSERT INTO {s}.features (name) SELECT unnest(%(features)s::text[])"
        "  ON CONFLICT DO NOTHING"
        if features
        else ""
    )
    return db.sql(
        "WITH ins AS ("
        "  INSERT INTO {s}.tasks (id, type, queue, state, priority, args, kwargs, key,"
        "   requirements, max_attempts, run_at, created_at, updated_at, timeout, depends_on,"
        "   deps_left, error, eff_priority, promote_at, trace, if_failed, limit_key,"
        "   limit_max, rate_interval, rate_burst, fair_key, central)"
        "  SELECT r.id, r.type, r.queue, r.state, r.priority, r.args, r.kwargs, r.key,"
        "   r.req::jsonb, r.max_attempts, {now} + r.delay, {now}, {now}, r.timeout,"
        "   CASE WHEN r.deps IS NULL THEN NULL"
        "    ELSE ARRAY(SELECT jsonb_array_elements_text(r.deps::jsonb)) END,"
        "   r.deps_left, r.error, r.priority, {now} + r.promote_in, r.trace,"
        "   CASE WHEN r.if_failed IS NULL THEN NULL"
        "    ELSE ARRAY(SELECT jsonb_array_elements_text(r.if_failed::jsonb)) END,"
        "   r.limit_key, r.limit_max, r.rate_interval, r.rate_burst, r.fair_key, r.central"
        f"  FROM unnest({types}) AS r({', '.join(_SUBMIT_COLUMNS)})"
        "  ON CONFLICT (id) DO NOTHING RETURNING id"
        "), born AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
        "  SELECT b.id, {now}, b.event, 0, NULL, b.detail"
        "  FROM unnest(%(id)s::text[], %(born_event)s::text[], %(born_detail)s::text[])"
        "   AS b(id, event, detail)"
        "  WHERE b.event IS NOT NULL AND b.id IN (SELECT id FROM ins)"
        "), deps AS ("
        "  INSERT INTO {s}.task_deps (dep_id, task_id)"
        "  SELECT * FROM unnest(%(dep_ids)s::text[], %(dep_tasks)s::text[])"
        "  ON CONFLICT DO NOTHING"
        "), rates AS ("
        # a key's rate is the one its latest submission declared; its state (tat) stays
        "  INSERT INTO {s}.rate_keys AS k (key, interval, burst)"
        "  SELECT DISTINCT ON (r.limit_key) r.limit_key, r.rate_interval, r.rate_burst"
        "  FROM unnest(%(id)s::text[], %(limit_key)s::text[], %(rate_interval)s::float8[],"
        "   %(rate_burst)s::int[]) WITH ORDINALITY AS r(id, limit_key, rate_interval, rate_burst, n)"
        "  WHERE r.rate_interval IS NOT NULL AND r.id IN (SELECT id FROM ins)"
        "  ORDER BY r.limit_key, r.n DESC"
        "  ON CONFLICT (key) DO UPDATE SET interval = excluded.interval, burst = excluded.burst,"
        "   full_until = k.tat - (excluded.burst - 1) * excluded.interval"
        f"{marked}"
        ") SELECT id, pg_notify(%(channel)s, '') FROM ins"
    )


def _dependencies_first(specs: Sequence[TaskSpec]) -> list[TaskSpec]:
    """*specs* reordered so that each comes after those of the batch it depends on (the batch
    has been checked for cycles); otherwise in their given order."""
    by_id = {s.id: s for s in specs}
    done: set[str] = set()
    out: list[TaskSpec] = []

    def visit(spec: TaskSpec) -> None:
        stack = [(spec, iter(spec.depends_on))]
        done.add(spec.id)
        while stack:
            node, deps = stack[-1]
            dep = next((d for d in deps if d in by_id and d not in done), None)
            if dep is None:
                out.append(node)
                stack.pop()
            else:
                done.add(dep)
                stack.append((by_id[dep], iter(by_id[dep].depends_on)))

    for spec in specs:
        if spec.id not in done:
            visit(spec)
    return out
