"""The memory store's rows and what every change of them goes through: the outcomes that
:mod:`contend.domain.transitions` decides, applied with the indexes kept in step, the
dependants settled, and the owner's fenced writes (a task's own transaction among them).
:class:`~contend.store.memory.store.MemoryStore` adds the rest of the store port."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from contend.domain import transitions as rules
from contend.domain.task import JSON, TaskState, unaged
from contend.domain.transitions import Holding, Outcome
from contend.errors import FencedOut
from contend.store._changes import Changes
from contend.store._common import check_retry_delay, check_ttl
from contend.store.memory.index import TaskIndex
from contend.store.memory.records import Row, record_event
from contend.store.memory.sessions import Sessions
from contend.store.memory.transactions import MemoryTransaction, check_key, conflict
from contend.store.port import Completion, Failure, Heartbeat

W, C, R = TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING


class Rows:
    """Tasks held in a dict with their indexes, on an injectable *clock*."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._tasks: dict[str, Row] = {}
        self._keys: dict[str, str] = {}
        self._dependents: dict[str, set[str]] = {}
        self._sessions = Sessions()
        self._index = TaskIndex()
        #: what the waits watch; work: changes that may have made a task claimable
        self._changes = Changes()
        self._touch = self._changes.touch
        #: set by _apply when an outcome may have made a task claimable
        self._freed = False
        self._done_times: list[tuple[float, str]] = []  # (when, queue) of each success
        self._values: dict[str, tuple[str, int]] = {}  # key -> (JSON text, version)
        self._value_version = 0

    def _take_freed(self) -> bool:
        """Whether an outcome applied since the last call may have made a task claimable."""
        freed, self._freed = self._freed, False
        return freed

    def _set_state(self, tid: str, row: Row, state: TaskState) -> None:
        """Move *row* to *state* and keep the indexes in step. Call it after changing run_at."""
        row.state = state
        self._index.place(tid, row)

    def _apply(
        self, tid: str, row: Row, outcome: Outcome, now: float, *, settle: bool = True
    ) -> None:
        """Apply a decided outcome (``contend.domain.transitions``) to a task the caller
        checked; owner, fence and lease of a claim are the caller's to set."""
        row.attempts = outcome.attempts.apply(row.attempts)
        due = outcome.run_at(row.run_at, now)
        if due != row.run_at:  # the age restarts from a new due time
            row.run_at = due
            row.aged, row.promote_at = unaged(row.spec.priority, due)
        if outcome.error_json is not None:
            row.error = outcome.error_json
        if outcome.result_json is not None:
            row.result = outcome.result_json
        if not outcome.owned:
            row.owner, row.lease_deadline = None, None
            # pending again, or a limited task's slot given back
            if outcome.state == TaskState.PENDING or row.spec.limit_key is not None:
                self._freed = True
        self._set_state(tid, row, outcome.state)
        row.updated_at = now
        record_event(row, now, outcome, row.fence)
        if outcome.state == TaskState.SUCCEEDED:
            self._done_times.append((now, row.spec.queue))
        if outcome.ends and settle:
            self._settle_dependents(tid, now)

    def _settle_dependents(self, task_id: str, now: float) -> None:
        """Tell the tasks waiting on *task_id* (and, in turn, on those it ends) that it ended."""
        done = self._tasks[task_id]
        todo = [(task_id, done.state)]
        while todo:
            tid, state = todo.pop()
            for dep_tid in sorted(self._dependents.pop(tid, ())):
                row = self._tasks[dep_tid]
                if row.state != W:
                    continue
                choice = row.spec.if_failed_of(tid)
                outcome = rules.dependency_ended(tid, state, row.deps_left, choice)
                row.deps_left -= 1
                if outcome is not None:
                    self._apply(dep_tid, row, outcome, now, settle=False)
                    if outcome.ends:
                        todo.append((dep_tid, outcome.state))

    # -- the owner's writes, each fenced ---------------------------------------------------
    def _owned(
        self,
        expert: str,
        task_id: str,
        fence: int,
        now: float,
        states: frozenset[TaskState] = rules.WRITE_STATES,
    ) -> Row | FencedOut:
        """The row of *task_id* if *expert* may write it under *fence*, else the refusal."""
        row = self._tasks.get(task_id)
        holding = (
            None if row is None else Holding(row.fence, row.owner, row.state, row.lease_deadline)
        )
        live = self._sessions.is_live(expert, now)
        refused = rules.refusal(
            task_id, fence, expert, holding, now, expert_live=live, states=states
        )
        if refused is not None:
            return refused
        assert row is not None
        return row

    def _write_each(
        self,
        expert: str,
        items: Sequence[tuple[str, int]],
        decide: Callable[[int], Outcome],
        states: frozenset[TaskState] = rules.WRITE_STATES,
    ) -> list[FencedOut | None]:
        """Apply ``decide(i)`` to the i-th of *items* (task id, fence) that *expert* still
        owns; the refusal for each one it does not."""
        now = self._clock()
        out: list[FencedOut | None] = []
        for i, (tid, fence) in enumerate(items):
            row = self._owned(expert, tid, fence, now, states)
            if isinstance(row, FencedOut):
                out.append(row)
                continue
            self._apply(tid, row, decide(i), now)
            out.append(None)
        return out

    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        outcome = rules.started(expert)
        return self._write_each(expert, items, lambda _: outcome, rules.START_STATES)

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        ttl = check_ttl(lease_ttl)
        now = self._clock()
        e = self._sessions.live(expert, session, now)
        e.lease_deadline = now + ttl
        e.heartbeat_at = now
        e.beat = beat
        held = {}
        for tid in self._index.held:
            row = self._tasks[tid]
            if (
                row.owner == expert
                and row.state in (C, R)
                and row.lease_deadline is not None
                and row.lease_deadline >= now
            ):
                row.lease_deadline = now + ttl
                held[tid] = row.fence
        return held

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        self._save(expert, task_id, fence, "checkpoint", state_json)

    async def progress(self, expert: str, task_id: str, fence: int, progress_json: str) -> None:
        self._save(expert, task_id, fence, "progress", progress_json)
        self._touch(work=False)  # a caller waiting on the task sees it at once

    def _save(self, expert: str, task_id: str, fence: int, what: str, text: str) -> None:
        """A fenced write of a running task's checkpoint or progress."""
        now = self._clock()
        row = self._owned(expert, task_id, fence, now)
        if isinstance(row, FencedOut):
            raise row
        setattr(row, what, text)
        row.updated_at = now

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        out = self._write_each(
            expert,
            [(item.task_id, item.fence) for item in items],
            lambda i: rules.completed(expert, items[i].result_json),
        )
        self._touch(work=self._take_freed())
        return out

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        for item in items:
            check_retry_delay(item.retry_delay)

        def decide(i: int) -> Outcome:
            item = items[i]
            return rules.failed(expert, item.error_json, item.retry_delay, item.final_state)

        out = self._write_each(expert, [(item.task_id, item.fence) for item in items], decide)
        self._touch(work=self._take_freed())
        return out

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        outcome = rules.released(expert)
        out = self._write_each(expert, items, lambda _: outcome)
        self._touch()
        return out

    # -- a task's own transaction (transactions.py) ----------------------------------------
    async def begin(self, expert: str, task_id: str, fence: int) -> MemoryTransaction:
        row = self._owned(expert, task_id, fence, self._clock())
        if isinstance(row, FencedOut):
            raise row
        return MemoryTransaction(self, expert, task_id, fence)

    def value(self, key: str) -> JSON:
        """The value of *key* in the store's key-value space, as committed transactions left
        it (None when absent)."""
        text, _ = self._read_value(check_key(key))
        return None if text is None else json.loads(text)

    def _read_value(self, key: str) -> tuple[str | None, int]:
        text, version = self._values.get(key, (None, 0))
        return text, version

    def _commit_values(
        self,
        expert: str,
        completion: Completion,
        reads: dict[str, int],
        writes: dict[str, str | None],
    ) -> None:
        """Check the claim and the reads, then apply the writes and the completion: one step,
        nothing awaited in between."""
        now = self._clock()
        row = self._owned(expert, completion.task_id, completion.fence, now)
        if isinstance(row, FencedOut):
            raise row
        for key, version in reads.items():
            if self._read_value(key)[1] != version:
                raise conflict(completion.task_id, key)
        for key, text in writes.items():
            if text is None:
                self._values.pop(key, None)
            else:
                self._value_version += 1
                self._values[key] = (text, self._value_version)
        outcome = rules.completed(expert, completion.result_json, in_transaction=True)
        self._apply(completion.task_id, row, outcome, now)
        self._touch()
