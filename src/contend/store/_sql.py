"""What the two SQL backends (SQLite and PostgreSQL) read alike: a task row of their
``TASK_COLUMNS``, and the filter of ``list_tasks``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from contend.domain.payload import decode_args, decode_kwargs
from contend.domain.task import JSON, Requirements, Task, TaskEvent, TaskState, load_trace


def load(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


def task_from_row(
    r: Sequence[Any], history: tuple[TaskEvent, ...] = (), *, text_json: bool = False
) -> Task:
    """A task from a row of ``TASK_COLUMNS`` (the same columns in the same order in both
    backends). *text_json*: the requirements, dependencies and ``if_failed`` columns hold
    JSON text (SQLite), not values the driver decoded (PostgreSQL's jsonb and arrays)."""
    req, deps, if_failed = r[8], r[21], r[24]
    if text_json:
        req, deps, if_failed = load(req), load(deps), load(if_failed)
    return Task(
        id=r[0],
        type=r[1],
        queue=r[2],
        state=TaskState(r[3]),
        priority=r[4],
        args=decode_args(r[5]),
        kwargs=decode_kwargs(r[6]),
        key=r[7],
        requirements=Requirements.from_json(req),
        attempts=r[9],
        max_attempts=r[10],
        fence=r[11],
        owner=r[12],
        lease_deadline=r[13],
        run_at=r[14],
        created_at=r[15],
        updated_at=r[16],
        timeout=r[17],
        result=load(r[18]),
        error=load(r[19]),
        checkpoint=load(r[20]),
        depends_on=tuple(deps or ()),
        history=history,
        progress=load(r[22]),
        trace=load_trace(r[23]),
        if_failed=tuple(if_failed or ()),
        limit_key=r[25],
        concurrency_limit=r[26],
        fair=bool(r[27]),
    )


def task_filter(
    state: TaskState | None, queue: str | None, type: str | None, mark: str
) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause ("" for none) and its parameters of ``list_tasks``; *mark* is the
    driver's placeholder (``?`` or ``%s``)."""
    where, params = [], []
    for column, value in (("state", state), ("queue", queue), ("type", type)):
        if value is not None:
            where.append(f"{column} = {mark}")
            params.append(str(TaskState(value)) if column == "state" else value)
    return (f"WHERE {' AND '.join(where)}" if where else ""), params
