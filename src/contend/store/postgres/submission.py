"""Submission: new tasks, their dependency edges and the wake-up, in one statement.

A batch with keys or dependencies first reads, in the same transaction, the ids and keys it
may repeat and the states of the dependencies it names (those rows held ``FOR SHARE``, so that
a dependency cannot finish unseen before the batch commits)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg.errors

from contend.domain import transitions as rules
from contend.domain.task import FIRST_STEP, TaskSpec, TaskState
from contend.errors import StoreError
from contend.store._common import check_batch_dependencies, refuse_limits, sort_out
from contend.store.port import Promises, Submitted
from contend.store.postgres.database import Cursor, Database, log

# The submitted rows travel as one JSON document, read by json_to_recordset: one parameter
# instead of an array per column (psycopg's adapting of 26 one-element lists cost more client
# CPU than the rest of a one-task submit). A key a row leaves out reads as NULL.
# name -> SQL type
_ROW_COLUMNS = {
    "id": "text",
    "type": "text",
    "queue": "text",
    "state": "text",
    "priority": "int",
    "args": "text",
    "kwargs": "text",
    "key": "text",
    "req": "jsonb",
    "max_attempts": "int",
    "delay": "float8",
    "timeout": "float8",
    "deps": "text[]",
    "deps_left": "int",
    "error": "text",
    "promote_in": "float8",
    "trace": "text",
    "if_failed": "text[]",
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
        rows, dep_rows = _rows(fresh, states)
        features = _features(fresh)
        shape = _Shape(
            born=any("born_event" in r for r in rows),
            deps=bool(dep_rows),
            rates=any("rate_interval" in r for r in rows),
            features=bool(features),
        )
        await cur.execute(
            db.text(shape, lambda: _submit_sql(db, shape)),
            db.params(
                rows=json.dumps(rows, separators=(",", ":")),
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
            done = await db.run(run, tx=not simple)
            if db.submitted is not None:
                db.submitted += len(specs)
                if db.submitted >= STATISTICS_AFTER:
                    await first_statistics(db)
            return done
        except StoreError as exc:
            cause = exc.__cause__
            if not isinstance(cause, psycopg.errors.UniqueViolation):
                raise
            if cause.diag.constraint_name == "tasks_key_key" and attempt < 2:
                continue  # another submitter inserted the same key: read it this time
            raise StoreError(f"submission refused by the database: {cause}") from cause
    raise AssertionError("unreachable")


#: Tasks an instance submits before it sees that the table has statistics.
STATISTICS_AFTER = 1_000


async def first_statistics(db: Database) -> None:
    """ANALYZE the tasks table if it has never been analyzed, once per instance.

    psycopg prepares a statement after a few runs, and the server keeps a generic plan made
    for the table's size at that moment until its statistics change. On a new store those
    plans were made for a nearly empty table, and some of them scanned it whole: the commit's
    update (a sequential scan of the tasks joined to the ids) grew to 8.4 ms and 1,260 buffers
    a call within a minute at 1,000 tasks/s, until autovacuum's first analyze (a minute or
    more; never, where autovacuum is off). An ANALYZE makes every session plan again."""
    db.submitted = None

    async def run(cur: Cursor) -> None:
        await cur.execute(
            "SELECT reltuples FROM pg_class WHERE oid = %(t)s::regclass",
            db.params(t=db.sql("{s}.tasks")),
        )
        row = await cur.fetchone()
        if row is not None and row[0] < STATISTICS_AFTER:
            await cur.execute(db.sql("ANALYZE {s}.tasks"))

    try:
        await db.run(run, tx=False)
    except StoreError as exc:  # not the table's owner, say: autovacuum will see to it
        log.info("could not analyze the tasks table: %s", exc)


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


def _rows(
    fresh: list[TaskSpec], states: dict[str, str]
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The insert's rows (``_ROW_COLUMNS``, a value that is None left out), and the
    dependency edges (dependency, dependant) still open. *states* gains the state of every
    new task."""
    rows: list[dict[str, Any]] = []
    dep_rows: list[tuple[str, str]] = []
    # Dependencies before their dependents, so that a task depending on one made dead
    # in this same batch (its own dependency had failed) is dead too, not left waiting
    # for a task that will never finish.
    for spec in _dependencies_first(fresh):
        known = {d: TaskState(states[d]) for d in spec.depends_on if d in states}
        birth = rules.submitted(spec.depends_on, known, spec.if_failed)
        left = birth.waits_on
        row: dict[str, Any] = {
            "id": spec.id,
            "type": spec.type,
            "queue": spec.queue,
            "state": str(birth.state),
            "priority": spec.priority,
            "args": spec.args_json,
            "kwargs": spec.kwargs_json,
            "max_attempts": spec.max_attempts,
            "delay": spec.delay,
            "deps_left": len(left),
            "promote_in": spec.delay + FIRST_STEP,  # after creation: unaged from its due time
            "central": spec.central,
        }
        optional = {
            "key": spec.key,
            "req": spec.requirements.to_json(),
            "timeout": spec.timeout,
            "deps": list(spec.depends_on) or None,
            "error": birth.error_json,
            "trace": spec.trace,
            "if_failed": list(spec.if_failed) or None,
            "limit_key": spec.limit_key,
            "limit_max": spec.concurrency_limit,
            "rate_interval": None if spec.rate_limit is None else spec.rate_limit.interval,
            "rate_burst": None if spec.rate_limit is None else spec.rate_limit.burst,
            "fair_key": spec.limit_key if spec.fair else None,
            "born_event": None if birth.event is None else str(birth.event),
            "born_detail": birth.detail,
        }
        row.update((k, v) for k, v in optional.items() if v is not None)
        rows.append(row)
        states[spec.id] = str(birth.state)
        dep_rows.extend((d, spec.id) for d in left)
    return rows, dep_rows


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
        if spec.priority != 0:
            used.add("levels")  # not a claim's feature: the low lane's (claims._lane)
    return sorted(used)


class _Shape(NamedTuple):
    """The parts a submit statement needs: each part a batch does not use is left out, since
    the executor opens every table and index a statement names, rows or none (a plain
    submit's statement with all of them took PostgreSQL about twice the time)."""

    born: bool  # a history line for tasks that end at birth
    deps: bool  # dependency edges
    rates: bool  # rate-limited keys
    features: bool  # the features table (migration 12)


def _submit_sql(db: Database, shape: _Shape) -> str:
    # one statement: the tasks, the history line of those that end at birth, their dependency
    # edges, the features they use (in the same statement, so that no claim sees the tasks
    # without them) and the notification
    columns = ", ".join(f"{n} {t}" for n, t in _ROW_COLUMNS.items())
    parts = [
        "WITH r AS ("
        f"  SELECT * FROM ROWS FROM (json_to_recordset(%(rows)s::json) AS ({columns}))"
        f"   WITH ORDINALITY AS r({', '.join(_ROW_COLUMNS)}, n)"
        "), ins AS ("
        "  INSERT INTO {s}.tasks (id, type, queue, state, priority, args, kwargs, key,"
        "   requirements, max_attempts, run_at, created_at, updated_at, timeout, depends_on,"
        "   deps_left, error, eff_priority, promote_at, trace, if_failed, limit_key,"
        "   limit_max, rate_interval, rate_burst, fair_key, central)"
        "  SELECT r.id, r.type, r.queue, r.state, r.priority, r.args, r.kwargs, r.key,"
        "   r.req, r.max_attempts, {now} + r.delay, {now}, {now}, r.timeout, r.deps,"
        "   r.deps_left, r.error, r.priority, {now} + r.promote_in, r.trace, r.if_failed,"
        "   r.limit_key, r.limit_max, r.rate_interval, r.rate_burst, r.fair_key, r.central"
        "  FROM r ORDER BY r.n"
        "  ON CONFLICT (id) DO NOTHING RETURNING id"
    ]
    if shape.born:
        parts.append(
            "), born AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
            "  SELECT r.id, {now}, r.born_event, 0, NULL, r.born_detail FROM r"
            "  WHERE r.born_event IS NOT NULL AND r.id IN (SELECT id FROM ins)"
        )
    if shape.deps:
        parts.append(
            "), deps AS ("
            "  INSERT INTO {s}.task_deps (dep_id, task_id)"
            "  SELECT * FROM unnest(%(dep_ids)s::text[], %(dep_tasks)s::text[])"
            "  ON CONFLICT DO NOTHING"
        )
    if shape.rates:
        parts.append(
            "), rates AS ("
            # a key's rate is the one its latest submission declared; its state (tat) stays
            "  INSERT INTO {s}.rate_keys AS k (key, interval, burst)"
            "  SELECT DISTINCT ON (r.limit_key) r.limit_key, r.rate_interval, r.rate_burst"
            "  FROM r WHERE r.rate_interval IS NOT NULL AND r.id IN (SELECT id FROM ins)"
            "  ORDER BY r.limit_key, r.n DESC"
            "  ON CONFLICT (key) DO UPDATE SET interval = excluded.interval,"
            "   burst = excluded.burst,"
            "   full_until = k.tat - (excluded.burst - 1) * excluded.interval"
        )
    if shape.features:
        parts.append(
            "), marked AS ("
            "  INSERT INTO {s}.features (name) SELECT unnest(%(features)s::text[])"
            "  ON CONFLICT DO NOTHING"
        )
    parts.append(") SELECT id, pg_notify(%(channel)s, '') FROM ins")
    return db.sql("".join(parts))


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
