"""Rows and values: how a task row becomes a :class:`Task` or a :class:`Claimed`, how JSON
columns are written, and the small reads and writes several parts share."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from contend.domain.payload import decode_args, decode_kwargs
from contend.domain.task import Requirements, TaskState, load_trace
from contend.store._sql import load
from contend.store.port import Claimed

#: A row of ``task_events``: task id, at, event, fence, expert, detail ("" for none: see
#: :func:`insert_events`).
EventRow = tuple[str, float, str, int, str | None, str]


def claimed_from_row(r: tuple[Any, ...], deadline: float) -> Claimed:
    """A claim from the ``RETURNING`` row of a claim or a steal."""
    return Claimed(
        id=r[0],
        type=r[1],
        queue=r[2],
        args=decode_args(r[3]),
        kwargs=decode_kwargs(r[4]),
        fence=r[5],
        attempt=r[6],
        max_attempts=r[7],
        checkpoint=load(r[8]),
        timeout=r[9],
        lease_deadline=deadline,
        priority=r[10],
        trace=load_trace(r[11]),
    )


def insert_events(db: sqlite3.Connection, rows: list[EventRow]) -> None:
    """Add history lines. A line without a detail passes "" and the column gets NULL: sqlite3
    binds None through its adapter lookup, about a microsecond a parameter more than a str,
    and most lines (every claim and completion) have no detail."""
    if rows:
        db.executemany(
            "INSERT INTO task_events (task_id, at, event, fence, expert, detail) "
            "VALUES (?,?,?,?,?,NULLIF(?, ''))",
            rows,
        )


def existing_ids(db: sqlite3.Connection, ids: Iterable[str]) -> set[str]:
    """Which of *ids* are tasks in the store."""
    found: set[str] = set()
    for chunk in chunks(list(ids), 500):
        marks = ",".join("?" * len(chunk))
        found.update(r[0] for r in db.execute(f"SELECT id FROM tasks WHERE id IN ({marks})", chunk))
    return found


def dep_states(db: sqlite3.Connection, ids: set[str]) -> dict[str, TaskState]:
    """The state of each of *ids* that is a task in the store."""
    states: dict[str, TaskState] = {}
    for chunk in chunks(list(ids), 500):
        marks = ",".join("?" * len(chunk))
        for tid, state in db.execute(f"SELECT id, state FROM tasks WHERE id IN ({marks})", chunk):
            states[tid] = TaskState(state)
    return states


def chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def req_json(req: Requirements) -> str | None:
    data = req.to_json()
    return None if data is None else json.dumps(data, separators=(",", ":"))
