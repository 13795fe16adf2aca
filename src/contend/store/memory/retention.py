"""Retention on the memory store: which finished tasks a prune pass deletes
(``contend.domain.retention`` says which may go)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from contend.domain.retention import PRUNABLE_STATES
from contend.domain.task import TaskState
from contend.store.memory.records import Row


def prunable(
    tasks: Mapping[str, Row], dependents: Mapping[str, Collection[str]], before: float, limit: int
) -> list[str]:
    """The oldest *limit* finished tasks last changed before *before* that no waiting task
    still waits on, oldest first."""
    old = sorted(
        (row.updated_at, tid)
        for tid, row in tasks.items()
        if row.state in PRUNABLE_STATES and row.updated_at < before
    )
    out: list[str] = []
    for _, tid in old:
        if len(out) >= limit:
            break
        if any(tasks[w].state == TaskState.WAITING for w in dependents.get(tid, ())):
            continue  # a waiting task still waits on it
        out.append(tid)
    return out


def cap_histories(rows: Iterable[Row], keep_events: int) -> None:
    """Each task's history at its first line and newest *keep_events* - 1 (the memory store
    caps histories as they are written too, ``records.py``)."""
    for row in rows:
        if len(row.history) > keep_events:
            del row.history[1 : len(row.history) - keep_events + 1]
