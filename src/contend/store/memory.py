"""The in-memory store: for unit tests and simulations. One process, one event loop.

It is also the reference for the other backends: the contract suite runs unchanged on it.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from contend.domain import transitions as rules
from contend.domain.scoring import TaskView
from contend.domain.task import (
    JSON,
    Capabilities,
    Requirements,
    Task,
    TaskEvent,
    TaskSpec,
    TaskState,
    aged_priority,
    next_promotion,
)
from contend.domain.transitions import Holding, Outcome
from contend.errors import FencedOut, TaskNotFound
from contend.store._common import (
    check_batch_dependencies,
    check_bid,
    check_limit,
    check_retry_delay,
    check_ttl,
    live_elsewhere,
    rank_bids,
    session_not_live,
    sort_out,
)
from contend.store._sorted import SortedKeys
from contend.store.port import (
    Auction,
    Backlog,
    Claimed,
    Completion,
    ExpertInfo,
    ExpertRecord,
    Failure,
    Heartbeat,
    Promises,
    StoreStats,
    Submitted,
)

P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING

#: Keep at most this many history events per task.
HISTORY_LIMIT = 200

#: Where a pending task sorts among the claimable: (-priority, run_at, id), best first.
_Key = tuple[int, float, str]
#: Requirements made hashable: (tags, resources).
_ReqKey = tuple[frozenset[str], tuple[tuple[str, float], ...]]


def _req_key(req: Requirements) -> _ReqKey:
    return req.tags, tuple(sorted(req.resources.items()))


@dataclass(slots=True)
class _Group:
    """The pending tasks of one queue that share one set of requirements, best first."""

    requirements: Requirements
    keys: SortedKeys[_Key] = field(default_factory=SortedKeys[_Key])

    def due(self, now: float) -> Iterator[_Key]:
        """Keys of tasks due by *now*, in claim order. Within a priority level tasks sort by
        run_at, so the first one not yet due ends the level: jump to the next one."""
        start: _Key | None = None
        while True:
            for key in self.keys.iter_from(start):
                if key[1] > now:
                    start = (key[0], math.inf, "")
                    break
                yield key
            else:
                return

    def earliest(self) -> float | None:
        """The smallest run_at: the first key of each priority level."""
        best: float | None = None
        start: _Key | None = None
        while (key := self.keys.first_from(start)) is not None:
            best = key[1] if best is None else min(best, key[1])
            start = (key[0], math.inf, "")
        return best


@dataclass(slots=True)
class _Row:
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
    history: list[TaskEvent] = field(default_factory=list)
    aged: int = 0  # effective priority, raised by ``expire`` as the task waits
    promote_at: float = 0.0
    key: _Key | None = None  # its place in the pending index while it is pending


@dataclass(slots=True)
class _Expert:
    info: ExpertInfo
    session: str
    lease_deadline: float
    heartbeat_at: float
    started_at: float
    beat: Heartbeat = field(default_factory=Heartbeat)


class MemoryStore:
    """A store held in this process's memory; *clock* is injectable for tests.

    Pending tasks are indexed per queue and per set of requirements, each group sorted by
    (-priority, run_at, id), so ``peek`` and ``claim`` cost about O(log n) per task returned
    instead of a scan of every task; owned tasks are indexed for ``renew`` and ``expire``.
    Every change of state goes through :meth:`_set_state`, which keeps the indexes in step.
    """

    promises = Promises()  # one process: every submission is atomic

    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self._clock = clock
        self._tasks: dict[str, _Row] = {}
        self._keys: dict[str, str] = {}
        self._dependents: dict[str, set[str]] = {}
        self._experts: dict[str, _Expert] = {}
        self._groups: dict[str, dict[_ReqKey, _Group]] = {}  # queue -> requirements -> pending
        self._held: dict[str, None] = {}  # ids of claimed or running tasks, in claim order
        self._promotions: list[tuple[float, str]] = []  # (promote_at, id), a heap for ageing
        self._changed = asyncio.Event()
        self._version = 0
        self._seen = 0
        self._done_times: list[float] = []
        self._bids: dict[str, dict[str, tuple[float, float]]] = {}  # task -> expert -> (score, at)
        self._auction_close: dict[str, float] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def now(self) -> float:
        return self._clock()

    def _touch(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _set_state(self, tid: str, row: _Row, state: TaskState) -> None:
        """Move *row* to *state* and keep the indexes in step. Call it after changing run_at."""
        if row.key is not None:
            group = self._groups[row.spec.queue][_req_key(row.spec.requirements)]
            group.keys.discard(row.key)
            row.key = None
        row.state = state
        if state == P:
            row.key = (-row.aged, row.run_at, tid)
            heapq.heappush(self._promotions, (row.promote_at, tid))
            groups = self._groups.setdefault(row.spec.queue, {})
            rk = _req_key(row.spec.requirements)
            found = groups.get(rk)
            if found is None:
                found = groups[rk] = _Group(row.spec.requirements)
            found.keys.add(row.key)
        if state in (C, R):
            self._held[tid] = None
        else:
            self._held.pop(tid, None)

    def _age(self, now: float) -> None:
        """Ageing: pending tasks whose next step is due gain it (and move in the index)."""
        heap = self._promotions
        while heap and heap[0][0] <= now:
            at, tid = heapq.heappop(heap)
            row = self._tasks.get(tid)
            if row is None or row.state != P or row.promote_at != at:
                continue  # stale entry: the task left pending, or moved already
            row.aged = aged_priority(row.spec.priority, now - row.created_at)
            row.promote_at = next_promotion(row.spec.priority, row.aged, row.created_at)
            self._set_state(tid, row, P)  # re-files it under its new key, queues the next step

    def _event(self, row: _Row, now: float, outcome: Outcome, fence: int) -> None:
        row.history.append(TaskEvent(now, outcome.event, fence, outcome.actor, outcome.detail))
        if len(row.history) > HISTORY_LIMIT:
            del row.history[1 : len(row.history) - HISTORY_LIMIT + 1]

    # -- submission and inspection ---------------------------------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        now = self._clock()
        fresh, out = sort_out(specs, self._tasks, self._keys)
        check_batch_dependencies(fresh, lambda ids: {i for i in ids if i in self._tasks})
        born_dead: list[str] = []
        for spec in fresh:
            birth = rules.submitted(spec.depends_on, self._states_of(spec.depends_on))
            left = birth.waits_on
            row = _Row(spec, birth.state, now + spec.delay, now, now, len(left))
            row.aged = spec.priority
            row.promote_at = next_promotion(spec.priority, spec.priority, now)
            row.error = birth.error_json
            self._tasks[spec.id] = row
            self._set_state(spec.id, row, birth.state)
            for dep in left:
                self._dependents.setdefault(dep, set()).add(spec.id)
            if spec.key is not None:
                self._keys[spec.key] = spec.id
            if row.state == TaskState.DEAD:
                born_dead.append(spec.id)
        for tid in born_dead:  # batch members that wait on it were inserted before it
            self._settle_dependents(tid, now)
        self._touch()
        return out

    def _states_of(self, ids: Sequence[str]) -> dict[str, TaskState]:
        """The states of those of *ids* in the store (in-batch ids are not inserted yet)."""
        return {tid: self._tasks[tid].state for tid in ids if tid in self._tasks}

    def _apply(
        self, tid: str, row: _Row, outcome: Outcome, now: float, *, settle: bool = True
    ) -> None:
        """Apply a decided outcome (``contend.domain.transitions``) to a task the caller
        checked; owner, fence and lease of a claim are the caller's to set."""
        row.attempts = outcome.attempts.apply(row.attempts)
        row.run_at = outcome.run_at(row.run_at, now)
        if outcome.error_json is not None:
            row.error = outcome.error_json
        if outcome.result_json is not None:
            row.result = outcome.result_json
        if not outcome.owned:
            row.owner, row.lease_deadline = None, None
        self._set_state(tid, row, outcome.state)
        row.updated_at = now
        self._event(row, now, outcome, row.fence)
        if outcome.state == TaskState.SUCCEEDED:
            self._done_times.append(now)
        if outcome.ends and settle:
            self._settle_dependents(tid, now)

    def _view(self, tid: str, row: _Row, history: bool = False) -> Task:
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
            history=tuple(row.history) if history else (),
        )

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        return self._view(task_id, row, history)

    async def list_tasks(
        self, *, state: TaskState | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Task]:
        check_limit(limit)
        out: list[Task] = []
        for tid in sorted(self._tasks):
            if len(out) >= limit:
                break
            row = self._tasks[tid]
            if (state is None or row.state == state) and (queue is None or row.spec.queue == queue):
                out.append(self._view(tid, row))
        return out

    async def stats(self) -> StoreStats:
        now = self._clock()
        counts: dict[str, dict[str, int]] = {}
        oldest: float | None = None
        for row in self._tasks.values():
            q = counts.setdefault(row.spec.queue, {})
            q[str(row.state)] = q.get(str(row.state), 0) + 1
            if row.state == P and row.run_at <= now:
                age = now - row.run_at
                oldest = age if oldest is None else max(oldest, age)
        self._done_times = [t for t in self._done_times if t > now - 60]
        return StoreStats(now, counts, await self.list_experts(), len(self._done_times), oldest)

    async def list_experts(self) -> list[ExpertRecord]:
        now = self._clock()
        return [
            ExpertRecord(
                info=e.info,
                session=e.session,
                alive=e.lease_deadline >= now,
                load=e.beat.load,
                lease_deadline=e.lease_deadline,
                heartbeat_at=e.heartbeat_at,
                started_at=e.started_at,
                claim_attempts=e.beat.claim_attempts,
                claims_won=e.beat.claims_won,
                tasks_done=e.beat.tasks_done,
                metrics=dict(e.beat.metrics),
            )
            for e in sorted(self._experts.values(), key=lambda e: e.info.id)
        ]

    # -- the claim protocol ----------------------------------------------------------------
    def _claimable(
        self, queues: Sequence[str], caps: Capabilities, now: float, limit: int, low_lane: int = 0
    ) -> list[str]:
        """Up to *limit* ids of due pending tasks *caps* can run: best first by (−effective
        priority, run_at, id), except that up to *low_lane* of them are instead the tasks due
        the longest, whatever their priority (that part scans every due task)."""
        streams = [
            group.due(now)
            for q in dict.fromkeys(queues)
            for group in self._groups.get(q, {}).values()
            if group.keys and caps.satisfies(group.requirements)
        ]
        if limit <= 0 or not streams:
            return []
        low_lane = min(low_lane, limit)
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams)
        keys = {key: None for _, key in zip(range(limit - low_lane), merged, strict=False)}
        if low_lane:
            everything = [
                key
                for q in dict.fromkeys(queues)
                for group in self._groups.get(q, {}).values()
                if group.keys and caps.satisfies(group.requirements)
                for key in group.due(now)
            ]
            keys.update(
                dict.fromkeys(heapq.nsmallest(low_lane, everything, key=lambda k: (k[1], k[2])))
            )
        return [key[2] for key in sorted(keys)]

    async def peek(
        self, queues: Sequence[str], capabilities: Capabilities, limit: int, *, low_lane: int = 0
    ) -> list[TaskView]:
        check_limit(limit)
        now = self._clock()
        out = []
        for tid in self._claimable(queues, capabilities, now, limit, low_lane):
            s = self._tasks[tid].spec
            out.append(
                TaskView(
                    tid, s.type, s.queue, s.priority, s.requirements, self._tasks[tid].created_at
                )
            )
        return out

    def _live_session(self, expert: str, session: str, now: float) -> _Expert:
        e = self._experts.get(expert)
        if e is None or e.session != session or e.lease_deadline < now:
            raise session_not_live(expert, session)
        return e

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
        now = self._clock()
        self._live_session(expert, session, now)
        if task_ids is None:
            chosen = self._claimable(queues, capabilities, now, limit, low_lane)
        else:
            wanted = set(task_ids)
            claimable = self._claimable(queues, capabilities, now, len(self._tasks))
            chosen = [tid for tid in claimable if tid in wanted][:limit]
        outcome = rules.claimed(expert, start=start)
        return [
            self._hand_over(tid, self._tasks[tid], expert, outcome, now, now + ttl)
            for tid in chosen
        ]

    def _hand_over(
        self, tid: str, row: _Row, expert: str, outcome: Outcome, now: float, deadline: float
    ) -> Claimed:
        row.owner = expert
        row.fence += 1
        row.lease_deadline = deadline
        self._apply(tid, row, outcome, now)
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
            lease_deadline=deadline,
            priority=s.priority,
        )

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
        now = self._clock()
        self._live_session(thief, session, now)
        qs = set(queues)
        loot = sorted(
            (
                (-row.aged, row.run_at, tid)
                for tid, row in self._tasks.items()
                if row.owner == victim
                and row.state == C
                and row.lease_deadline is not None
                and row.lease_deadline >= now
                and row.spec.queue in qs
                and capabilities.satisfies(row.spec.requirements)
            )
        )[:limit]
        outcome = rules.stolen(thief, victim)
        return [
            self._hand_over(tid, self._tasks[tid], thief, outcome, now, now + ttl)
            for _, _, tid in loot
        ]

    def _owned(
        self,
        expert: str,
        task_id: str,
        fence: int,
        now: float,
        states: frozenset[TaskState] = rules.WRITE_STATES,
    ) -> _Row | FencedOut:
        row = self._tasks.get(task_id)
        holding = (
            None if row is None else Holding(row.fence, row.owner, row.state, row.lease_deadline)
        )
        e = self._experts.get(expert)
        live = e is not None and e.lease_deadline >= now
        refused = rules.refusal(
            task_id, fence, expert, holding, now, expert_live=live, states=states
        )
        if refused is not None:
            return refused
        assert row is not None
        return row

    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        now = self._clock()
        out: list[FencedOut | None] = []
        for tid, fence in items:
            row = self._owned(expert, tid, fence, now, rules.START_STATES)
            if isinstance(row, FencedOut):
                out.append(row)
                continue
            self._apply(tid, row, rules.started(expert), now)
            out.append(None)
        return out

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        ttl = check_ttl(lease_ttl)
        now = self._clock()
        e = self._live_session(expert, session, now)
        e.lease_deadline = now + ttl
        e.heartbeat_at = now
        e.beat = beat
        held = {}
        for tid in self._held:
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
        now = self._clock()
        row = self._owned(expert, task_id, fence, now)
        if isinstance(row, FencedOut):
            raise row
        row.checkpoint = state_json
        row.updated_at = now

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        now = self._clock()
        out: list[FencedOut | None] = []
        for item in items:
            row = self._owned(expert, item.task_id, item.fence, now)
            if isinstance(row, FencedOut):
                out.append(row)
                continue
            self._apply(item.task_id, row, rules.completed(expert, item.result_json), now)
            out.append(None)
        self._touch()
        return out

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        for item in items:
            check_retry_delay(item.retry_delay)
        now = self._clock()
        out: list[FencedOut | None] = []
        for item in items:
            row = self._owned(expert, item.task_id, item.fence, now)
            if isinstance(row, FencedOut):
                out.append(row)
                continue
            outcome = rules.failed(expert, item.error_json, item.retry_delay, item.final_state)
            self._apply(item.task_id, row, outcome, now)
            out.append(None)
        self._touch()
        return out

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        now = self._clock()
        out: list[FencedOut | None] = []
        for tid, fence in items:
            row = self._owned(expert, tid, fence, now)
            if isinstance(row, FencedOut):
                out.append(row)
                continue
            self._apply(tid, row, rules.released(expert), now)
            out.append(None)
        self._touch()
        return out

    async def expire(self) -> int:
        now = self._clock()
        moved = 0
        for tid in list(self._held):
            row = self._tasks[tid]
            if row.state in (C, R) and row.lease_deadline is not None and row.lease_deadline < now:
                outcome = rules.expired(row.owner, row.attempts, row.spec.max_attempts)
                self._apply(tid, row, outcome, now)
                moved += 1
        self._age(now)  # after the lapse: returned tasks catch up on their ageing too
        for tid in [t for t in self._bids if self._tasks[t].state != P]:
            del self._bids[tid]
            self._auction_close.pop(tid, None)
        for eid in [k for k, e in self._experts.items() if e.lease_deadline < now - 3600]:
            del self._experts[eid]
        if moved:
            self._touch()
        return moved

    def _settle_dependents(self, task_id: str, now: float) -> None:
        done = self._tasks[task_id]
        todo = [(task_id, done.state)]
        while todo:
            tid, state = todo.pop()
            for dep_tid in sorted(self._dependents.pop(tid, ())):
                row = self._tasks[dep_tid]
                if row.state != W:
                    continue
                outcome = rules.dependency_ended(tid, state, row.deps_left)
                row.deps_left -= 1
                if outcome is not None:
                    self._apply(dep_tid, row, outcome, now, settle=False)
                    if outcome.ends:
                        todo.append((dep_tid, outcome.state))

    # -- management ------------------------------------------------------------------------
    async def cancel(self, task_id: str) -> Task:
        now = self._clock()
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        self._apply(task_id, row, rules.cancelled(task_id, row.state, row.owner), now)
        self._touch()
        return self._view(task_id, row)

    async def retry(self, task_id: str) -> Task:
        now = self._clock()
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        self._apply(task_id, row, rules.retried(task_id, row.state), now)
        self._touch()
        return self._view(task_id, row)

    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        ttl = check_ttl(lease_ttl)
        now = self._clock()
        old = self._experts.get(info.id)
        if old is not None and old.lease_deadline >= now:
            raise live_elsewhere(info.id, old.info.host, old.info.pid)
        if old is not None:
            # The old session's claims end with it: a new session never inherits them.
            for row in self._tasks.values():
                if row.owner == info.id and row.state in (C, R) and row.lease_deadline is not None:
                    row.lease_deadline = min(row.lease_deadline, old.lease_deadline)
        session = uuid.uuid4().hex
        self._experts[info.id] = _Expert(info, session, now + ttl, now, now)
        return session

    async def deregister_expert(self, expert: str, session: str) -> None:
        e = self._experts.get(expert)
        if e is not None and e.session == session:
            e.lease_deadline = min(e.lease_deadline, self._clock() - 1e-6)
            e.beat = replace(e.beat, load=0)

    # -- wake-ups --------------------------------------------------------------------------
    async def wait_for_change(self, timeout: float) -> None:
        if self._version == self._seen:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                pass
        self._seen = self._version

    async def bid(
        self, expert: str, session: str, task_id: str, score: float, window: float
    ) -> Auction:
        score, window = check_bid(score, window)
        now = self._clock()
        self._live_session(expert, session, now)
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        if row.state != P:
            return Auction(task_id, now, self._auction_close.get(task_id, now), (), open=False)
        bids = self._bids.setdefault(task_id, {})
        closes = self._auction_close.setdefault(task_id, now + window)
        if expert not in bids or bids[expert][0] != score:
            bids[expert] = (score, bids.get(expert, (score, now))[1])
        return Auction(task_id, now, closes, rank_bids(bids))

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        now = self._clock()
        qs = set(queues)
        due = [
            r.run_at
            for r in self._tasks.values()
            if r.state == P and r.spec.queue in qs and r.run_at <= now
        ]
        return Backlog(len(due), (now - min(due)) if due else None)

    async def next_due(self, queues: Sequence[str]) -> float | None:
        due = [
            t
            for q in dict.fromkeys(queues)
            for group in self._groups.get(q, {}).values()
            if (t := group.earliest()) is not None
        ]
        return min(due) if due else None


def _load(text: str | None) -> JSON:
    return None if text is None else json.loads(text)
