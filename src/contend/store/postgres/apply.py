"""Applying decided outcomes: the store's half of ``contend.domain.transitions``.

The caller decides each task's :class:`~contend.domain.transitions.Outcome`; here they become
one ``UPDATE … FROM unnest(…)`` (as River's ``JobSetStateIfRunningMany`` takes its caller's
states as arrays) that writes each outcome to its task only where the *guard* still holds, and
records the outcome's history line in the same statement. Nothing is decided here: the SQL
below only says how each field of an outcome is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from operator import attrgetter
from typing import Any

from contend.domain.task import FIRST_STEP, TaskState
from contend.domain.transitions import Attempts, Outcome
from contend.store.postgres.database import ENDED, LOWERED, Database

#: One decided outcome for one task: (task id, its fence, the outcome).
Decided = tuple[str, int, Outcome]

#: How each :class:`Attempts` is written (``Attempts.apply`` in SQL; ``t`` is the task).
ATTEMPTS_SQL: dict[Attempts, str] = {
    Attempts.KEEP: "t.attempts",
    Attempts.COUNT: "t.attempts + 1",
    Attempts.GIVE_BACK: "greatest(0, t.attempts - 1)",
    Attempts.RESET: "0",
}

#: The guard of rows the caller holds ``FOR UPDATE`` (expiry, dependants, management).
LOCKED = "t.id = i.id AND t.fence = i.fence"

#: Every field of an :class:`Outcome`, as the array it travels in: field -> (column, type).
OUTCOME_FIELDS: dict[str, tuple[str, str]] = {
    "state": ("state", "text"),
    "event": ("event", "text"),
    "actor": ("actor", "text"),
    "detail": ("detail", "text"),
    "due_in": ("due_in", "float8"),
    "due_now": ("due_now", "bool"),
    "due_by_now": ("due_by_now", "bool"),
    "error_json": ("error", "text"),
    "result_json": ("result", "text"),
    "attempts": ("attempts", "text"),
    "owned": ("owned", "bool"),
}

_GET = attrgetter(*OUTCOME_FIELDS)

# error_json/result_json (set when given), owned (else owner and lease cleared)
_SET = (
    "state = {state},"
    " attempts = CASE {attempts} {attempts_cases} END,"
    " error = coalesce({error}, t.error), result = coalesce({result}, t.result),"
    " owner = CASE WHEN {owned} THEN t.owner END,"
    " lease_deadline = CASE WHEN {owned} THEN t.lease_deadline END,"
    " updated_at = {{now}}"
)
# Outcome.run_at; a new due time restarts the task's age from it (domain.task.unaged)
_DUE = (
    "CASE WHEN {due_in} IS NOT NULL THEN {{now}} + {due_in}"
    " WHEN {due_now} THEN greatest(t.run_at, {{now}})"
    " WHEN {due_by_now} THEN least(t.run_at, {{now}}) ELSE t.run_at END"
)
_SET_DUE = (
    ", run_at = {due}"
    ", eff_priority = CASE WHEN {due} = t.run_at THEN t.eff_priority ELSE t.priority END"
    f", promote_at = CASE WHEN {{due}} = t.run_at THEN t.promote_at ELSE {{due}} + {FIRST_STEP!r}"
    " END"
)
_ATTEMPTS_CASES = " ".join(f"WHEN '{a.value}' THEN {sql}" for a, sql in ATTEMPTS_SQL.items())


def moves_due(outcome: Outcome) -> bool:
    """Whether *outcome* may set a new due time (else the statement leaves ``run_at`` and the
    ageing columns out)."""
    return outcome.due_in is not None or outcome.due_now or outcome.due_by_now


def lowers(outcome: Outcome) -> bool:
    """Whether *outcome* may leave a task claimable below a claim's floor (``floors``): pending
    with the due time it had (given back, lapsed, its dependencies over), not due from now."""
    return outcome.state == TaskState.PENDING and outcome.due_in is None and not outcome.due_now


def apply(
    db: Database,
    guard: str,
    decided: Sequence[Decided],
    *,
    notify: bool = False,
    before: str = "",
    returning: str = "",
    live: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The statement that applies *decided* where *guard* holds (``t`` is the task, ``i`` the
    task's id, fence and outcome), recording their history lines, and its parameters. It
    returns ``(id, state)`` of each task it changed; with *notify* it also wakes the listeners
    (at commit). *before* is more CTEs (each ending in a comma) for the same statement;
    *returning* more columns of ``applied`` to return after those two; *live*: the time when
    the statement runs, not its transaction's start (``Database.sql``).

    A field that has one value for the whole batch (for a completion, all but the result) is
    sent once rather than as an array: the text depends only on which fields vary, so each
    kind of write keeps one prepared statement, and the parameters cost what they did before
    the outcomes were decided in the domain.

    The rows are given in id order, so that the statement locks them in that order (a
    nested loop over the arrays), as a lease renewal does: a renewal and a write of one
    expert's tasks used to deadlock, and each deadlock stalled both for deadlock_timeout."""
    decided = sorted(decided, key=lambda d: d[0])
    params: dict[str, Any] = {
        "o_id": [tid for tid, _, _ in decided],
        "o_fence": [fence for _, fence, _ in decided],
    }
    arrays = ["%(o_id)s::text[]", "%(o_fence)s::bigint[]"]
    names = ["id", "fence"]
    refs: dict[str, str] = {}
    rows = [_GET(o) for _, _, o in decided]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in OUTCOME_FIELDS]
    for (column, kind), values in zip(OUTCOME_FIELDS.values(), columns, strict=True):
        if values and values.count(values[0]) == len(values):
            params[f"o_{column}"] = _plain(values[0])
            refs[column] = f"%(o_{column})s::{kind}"
        else:
            params[f"o_{column}"] = [_plain(v) for v in values]
            arrays.append(f"%(o_{column})s::{kind}[]")
            names.append(column)
            refs[column] = f"i.{column}"
    assign = _SET.format(attempts_cases=_ATTEMPTS_CASES, **refs)
    if any(moves_due(o) for _, _, o in decided):
        assign += _SET_DUE.format(due=_DUE.format(**refs))
    # a task pending again may stand below a claim's floor (``floors``): say so
    lowered = any(lowers(o) for _, _, o in decided)
    # a task that ended without a limit's slot to give back wakes no idle expert (ENDED);
    # its dependants, if any, are settled with their own notification (dependants.py)
    work = LOWERED if lowered else ""
    wake = (
        f", pg_notify(%(channel)s, CASE WHEN state = 'pending' OR limited THEN '{work}'"
        f" ELSE '{ENDED}' END)"
        if notify
        else ""
    )
    sql = db.sql(
        f"WITH {before} applied AS ("
        f"  UPDATE {{s}}.tasks t SET {assign}"
        f"  FROM unnest({', '.join(arrays)}) AS i({', '.join(names)})"
        f"  WHERE {guard}"
        f"  RETURNING t.id, t.fence, t.state, t.limit_key IS NOT NULL AS limited,"
        f"   {refs['event']} AS event,"
        f"   {refs['actor']} AS actor, {refs['detail']} AS detail"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
        "  SELECT id, {now}, event, fence, actor, detail FROM applied"
        f") SELECT id, state{returning}{wake} FROM applied",
        live=live,
    )
    return sql, params


def _plain(value: Any) -> Any:
    """An enum as its value, so that the database gets text; anything else as it is."""
    return value.value if isinstance(value, Enum) else value


def handover(outcome: Outcome) -> tuple[str, str, dict[str, Any]]:
    """For an outcome that hands tasks to a new owner (a claim, a steal), decided once for the
    whole batch: its ``SET`` items (state, attempts), the ``SELECT`` list of its history line
    (``id`` and ``fence`` read from the updated rows), and their parameters. The caller sets
    the owner, the fence + 1 and the lease, as the domain leaves those to the store."""
    if (
        not outcome.owned
        or moves_due(outcome)
        or outcome.error_json is not None
        or outcome.result_json is not None
    ):
        raise ValueError(f"not an outcome that hands a task over: {outcome}")
    assign = f"state = %(h_state)s, attempts = {ATTEMPTS_SQL[outcome.attempts]}"
    line = "id, {now}, %(h_event)s::text, fence, %(h_actor)s::text, %(h_detail)s::text"
    params = {
        "h_state": str(outcome.state),
        "h_event": str(outcome.event),
        "h_actor": outcome.actor,
        "h_detail": outcome.detail,
    }
    return assign, line, params
