"""What the memory store keeps per task, and the port's values made from it.

A :class:`Row` is a task as the store holds it: the submitted spec plus its mutable state.
The functions below turn rows into what the port hands out (``Task``, ``TaskView``,
``Claimed``) and append to a row's history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from contend.domain.scoring import TaskView
from contend.domain.task import JSON, Task, TaskEvent, TaskSpec, TaskState, load_trace
from contend.domain.transitions import Outcome
from contend.store.port import Claimed

#: Keep at most this many history events per task.
HISTORY_LIMIT = 200

#: Where a pending task sorts among the claimable: (-priority, run_at, id), best first.
Key = tuple[int, float, str]


@dataclass(slots=True)
class Row:
    """One task: its spec, its state, and its place in the pending index while pending."""

    spec: TaskSpec
    state: TaskState
    run_at: float
    created_at: float
    updated_at: float
    deps_left: int = 0
    attempts: int = 0
    fence: int = 0
    owner: str | None = None
    lease_deadline: float | None = None
    result: str | None = None
    error: str | None = None
    checkpoint: str | None = None
    progress: str | None = None
    history: list[TaskEvent] = field(default_factory=list)
    aged: int = 0  # effective priority, raised by ``expire`` as the task waits
    promote_at: float = 0.0
    key: Key | None = None  # its place in the pending index while it is pending
    assignee: str | None = None  # a pending central task: the expert its leader gave it to


def record_event(row: Row, now: float, outcome: Outcome, fence: int) -> None:
    """Append *outcome*'s history event, dropping the oldest but the first past the limit."""
    row.history.append(TaskEvent(now, outcome.event, fence, outcome.actor, outcome.detail))
    if len(row.history) > HISTORY_LIMIT:
        del row.history[1 : len(row.history) - HISTORY_LIMIT + 1]


def task_of(tid: str, row: Row, history: bool = False) -> Task:
    s = row.spec
    return Task(
        id=tid,
        type=s.type,
        queue=s.queue,
        state=row.state,
        priority=s.priority,
        args=json.loads(s.args_json),
        kwargs=json.loads(s.kwargs_json),
        key=s.key,
        requirements=s.requirements,
        attempts=row.attempts,
        max_attempts=s.max_attempts,
        fence=row.fence,
        owner=row.owner,
        lease_deadline=row.lease_deadline,
        run_at=row.run_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        timeout=s.timeout,
        result=_load(row.result),
        error=_load(row.error),
        checkpoint=_load(row.checkpoint),
        depends_on=s.depends_on,
        if_failed=s.if_failed,
        history=tuple(row.history) if history else (),
        progress=_load(row.progress),
        trace=load_trace(s.trace),
        limit_key=s.limit_key,
        concurrency_limit=s.concurrency_limit,
        fair=s.fair,
    )


def view_of(tid: str, row: Row) -> TaskView:
    """What ``peek`` shows of a claimable task."""
    s = row.spec
    return TaskView(tid, s.type, s.queue, s.priority, s.requirements, row.created_at)


def claimed_of(tid: str, row: Row, lease_deadline: float) -> Claimed:
    """What the new owner of a task just claimed or stolen receives."""
    s = row.spec
    return Claimed(
        id=tid,
        type=s.type,
        queue=s.queue,
        args=json.loads(s.args_json),
        kwargs=json.loads(s.kwargs_json),
        fence=row.fence,
        attempt=row.attempts,
        max_attempts=s.max_attempts,
        checkpoint=_load(row.checkpoint),
        timeout=s.timeout,
        lease_deadline=lease_deadline,
        priority=s.priority,
        trace=load_trace(s.trace),
    )


def _load(text: str | None) -> JSON:
    return None if text is None else json.loads(text)
