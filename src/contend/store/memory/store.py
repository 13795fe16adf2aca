"""The memory store's facade: :class:`MemoryStore`, which applies the outcomes that
:mod:`contend.domain.transitions` decides to rows held in a dict, and keeps the indexes of
:mod:`contend.store.memory.index` in step."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import islice

from contend.domain import auction
from contend.domain import transitions as rules
from contend.domain.ids import check_id_prefix
from contend.domain.limits import KeyState
from contend.domain.retention import check_prune
from contend.domain.scoring import TaskView
from contend.domain.task import (
    Capabilities,
    Task,
    TaskEvent,
    TaskSpec,
    TaskState,
    unaged,
)
from contend.domain.transitions import Outcome
from contend.errors import TaskNotFound
from contend.store._common import (
    check_batch_dependencies,
    check_bid,
    check_limit,
    check_ttl,
    sort_out,
)
from contend.store.memory.dispatch import Leaders
from contend.store.memory.limits import Limits
from contend.store.memory.records import Row, claimed_of, task_of, view_of
from contend.store.memory.retention import cap_histories, prunable
from contend.store.memory.rows import Rows
from contend.store.port import (
    Auction,
    Backlog,
    CentralBacklog,
    CentralDispatch,
    Claimed,
    ExpertInfo,
    ExpertRecord,
    Promises,
    StoreStats,
    Submitted,
)

P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING


class MemoryStore(Rows):
    """A store held in this process's memory; *clock* is injectable for tests.

    Pending tasks are indexed per queue and per set of requirements (a :class:`TaskIndex`),
    so ``peek`` and ``claim`` cost about O(log n) per task returned instead of a scan of every
    task; owned tasks are indexed for ``renew`` and ``expire``. Every change of state goes
    through :meth:`_set_state`, which keeps the indexes in step.
    """

    #: One process: every submission is atomic. A task's transaction reads and writes the
    #: store's key-value space (``value()``), without a lock: a conflict is found at commit.
    promises = Promises(
        transactions=True,
        concurrency_limits=True,
        rate_limits=True,
        fair_share=True,
        central_dispatch=True,
    )

    def __init__(
        self,
        url: str = "memory://",
        *,
        clock: Callable[[], float] = time.time,
        create: bool = True,  # every memory store is new: nothing to refuse
    ) -> None:
        super().__init__(clock)
        self.url = url
        self._leaders = Leaders(self._tasks, self._index, self._sessions)
        self._bids: dict[str, dict[str, tuple[float, float]]] = {}  # task -> expert -> (score, at)
        self._limits = Limits(self._tasks)
        self._auctions: dict[str, tuple[float, float]] = {}  # task -> (closes_at, grace)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def now(self) -> float:
        return self._clock()

    # -- submission and inspection ---------------------------------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        now = self._clock()
        fresh, out = sort_out(specs, self._tasks, self._keys)
        check_batch_dependencies(fresh, lambda ids: {i for i in ids if i in self._tasks})
        born_dead: list[str] = []
        for spec in fresh:
            states = self._states_of(spec.depends_on)
            birth = rules.submitted(spec.depends_on, states, spec.if_failed)
            left = birth.waits_on
            row = Row(spec, birth.state, now + spec.delay, now, now, len(left))
            self._limits.note(spec)
            row.aged, row.promote_at = unaged(spec.priority, row.run_at)
            row.error = birth.error_json
            if birth.event is not None:
                row.history.append(TaskEvent(now, birth.event, 0, None, birth.detail))
            if spec.priority != 0:
                self._index.use_levels(self._tasks)
            self._tasks[spec.id] = row
            self._set_state(spec.id, row, birth.state)
            for dep in left:
                self._dependents.setdefault(dep, set()).add(spec.id)
            if spec.key is not None:
                self._keys[spec.key] = spec.id
            if row.state.terminal:
                born_dead.append(spec.id)
        for tid in born_dead:  # batch members that wait on it were inserted before it
            self._settle_dependents(tid, now)
        self._touch()
        return out

    def _states_of(self, ids: Sequence[str]) -> dict[str, TaskState]:
        """The states of those of *ids* in the store (in-batch ids are not inserted yet)."""
        return {tid: self._tasks[tid].state for tid in ids if tid in self._tasks}

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        return task_of(task_id, row, history)

    async def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        queue: str | None = None,
        type: str | None = None,
        newest: bool = False,
        limit: int = 100,
    ) -> list[Task]:
        check_limit(limit)
        wanted = (
            (tid, row)
            for tid, row in sorted(self._tasks.items(), reverse=newest)  # ids are unique
            if (state is None or row.state == state)
            and (queue is None or row.spec.queue == queue)
            and (type is None or row.spec.type == type)
        )
        return [task_of(tid, row) for tid, row in islice(wanted, limit)]

    async def dependants(self, task_id: str, *, limit: int = 100) -> list[Task]:
        check_limit(limit)
        found = sorted(tid for tid, row in self._tasks.items() if task_id in row.spec.depends_on)
        return [task_of(tid, self._tasks[tid]) for tid in found[:limit]]

    async def key_states(self, keys: Collection[str]) -> dict[str, KeyState]:
        return self._limits.states(set(keys), self._index.held)

    async def ids_with_prefix(self, prefix: str, *, limit: int = 10) -> list[str]:
        check_id_prefix(prefix)
        check_limit(limit)
        return sorted(tid for tid in self._tasks if tid.startswith(prefix))[:limit]

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
        self._done_times = [(t, q) for t, q in self._done_times if t > now - 60]
        done: dict[str, int] = {}
        for _, queue in self._done_times:
            done[queue] = done.get(queue, 0) + 1
        experts = await self.list_experts()
        return StoreStats(now, counts, experts, len(self._done_times), oldest, done)

    async def list_experts(self) -> list[ExpertRecord]:
        now = self._clock()
        return self._sessions.records(now)

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        now = self._clock()
        qs = set(queues)
        due = [
            r.run_at
            for r in self._tasks.values()
            if r.state == P and r.spec.queue in qs and r.run_at <= now
        ]
        return Backlog(len(due), (now - min(due)) if due else None)

    async def next_due(self, queues: Sequence[str], *, later: bool = False) -> float | None:
        return self._index.next_due(queues)

    # -- the claim protocol ----------------------------------------------------------------
    async def peek(
        self,
        queues: Sequence[str],
        capabilities: Capabilities,
        limit: int,
        *,
        low_lane: int = 0,
        types: Collection[str] | None = None,
    ) -> list[TaskView]:
        check_limit(limit)
        now = self._clock()
        order = self._limits.order(self._limits.holders(self._index.held) or {})
        chosen = self._index.claimable(
            queues, capabilities, now, limit, low_lane, types, tasks=self._tasks, order=order
        )
        return [view_of(tid, self._tasks[tid]) for tid in chosen]

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
        types: Collection[str] | None = None,
    ) -> list[Claimed]:
        check_limit(limit)
        ttl = check_ttl(lease_ttl)
        now = self._clock()
        self._sessions.live(expert, session, now)
        index = self._index
        wanted = None if task_ids is None else set(task_ids)
        held = self._limits.holders(self._index.held)
        without = self._held_back(expert, now)
        mine = self._leaders.mine(
            expert,
            queues,
            capabilities,
            now,
            limit,
            ids=wanted,
            types=types,
            without=without,
            held=held,
            rooms=lambda keys: self._limits.room_of(keys, now),
        )
        if held is not None:
            for tid in mine:  # they take their keys' places before the others are admitted
                key = self._tasks[tid].spec.limit_key
                if key is not None:
                    held[key] = held.get(key, 0) + 1
        chosen = index.claimable(
            queues,
            capabilities,
            now,
            len(self._tasks) if held is not None else limit - len(mine),
            low_lane,
            types,
            ids=wanted,
            tasks=self._tasks,
            without=without,
            # with limits, keep the lane's share first, then the fair or best order
            order=None if held is None else self._limits.order(held) or (lambda ids: ids),
        )
        if held is not None:  # keyed tasks pending: keep their limits
            chosen = self._limits.admit(mine, chosen, held, limit, now)
        else:
            chosen = mine + chosen
        outcome = rules.claimed(expert, start=start)
        return [
            self._hand_over(tid, self._tasks[tid], expert, outcome, now, now + ttl)
            for tid in chosen
        ]

    def _hand_over(
        self, tid: str, row: Row, expert: str, outcome: Outcome, now: float, deadline: float
    ) -> Claimed:
        row.owner = expert
        row.fence += 1
        row.lease_deadline = deadline
        self._apply(tid, row, outcome, now)
        return claimed_of(tid, row, deadline)

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
        types: Collection[str] | None = None,
    ) -> list[Claimed]:
        check_limit(limit)
        ttl = check_ttl(lease_ttl)
        now = self._clock()
        self._sessions.live(thief, session, now)
        qs = set(queues)
        kinds = None if types is None else set(types)
        loot = sorted(
            (
                (-row.aged, row.run_at, tid)
                for tid, row in self._tasks.items()
                if row.owner == victim
                and row.state == C
                and not row.spec.central
                and row.lease_deadline is not None
                and row.lease_deadline >= now
                and row.spec.queue in qs
                and (kinds is None or row.spec.type in kinds)
                and capabilities.satisfies(row.spec.requirements)
            )
        )[:limit]
        outcome = rules.stolen(thief, victim)
        return [
            self._hand_over(tid, self._tasks[tid], thief, outcome, now, now + ttl)
            for _, _, tid in loot
        ]

    # -- central queues (contend.domain.dispatch) -------------------------------------------
    async def lead(self, expert: str, session: str, name: str, ttl: float) -> int | None:
        return self._leaders.lead(expert, session, name, check_ttl(ttl), self._clock())

    async def assign(
        self, expert: str, session: str, name: str, term: int, assignments: Mapping[str, str]
    ) -> int:
        given = self._leaders.assign(expert, session, name, term, assignments, self._clock())
        if given:
            self._touch()
        return given

    async def central_backlog(
        self, queues: Sequence[str], live: Collection[str], limit: int
    ) -> CentralBacklog:
        check_limit(limit)
        return self._leaders.backlog(queues, live, limit, self._clock())

    async def bid(
        self,
        expert: str,
        session: str,
        task_id: str,
        score: float,
        window: float,
        grace: float = auction.DEFAULT_GRACE,
    ) -> Auction:
        score, window, grace = check_bid(score, window, grace)
        now = self._clock()
        self._sessions.live(expert, session, now)
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        if row.state != P:
            closes, grace = self._auctions.get(task_id, (now, grace))
            return Auction(task_id, now, closes, (), open=False, grace=grace)
        bids = self._bids.setdefault(task_id, {})
        closes, grace = self._auctions.setdefault(task_id, (now + window, grace))
        if now < closes and (expert not in bids or bids[expert][0] != score):
            bids[expert] = (score, bids.get(expert, (score, now))[1])
        return Auction(task_id, now, closes, auction.rank_bids(bids), grace=grace)

    def _held_back(self, expert: str, now: float) -> set[str]:
        """The tasks whose auction does not let *expert* claim yet."""
        return {
            tid
            for tid, (closes, grace) in self._auctions.items()
            if now < auction.may_claim_at(closes, grace, auction.rank_bids(self._bids[tid]), expert)
        }

    # -- housekeeping and management -------------------------------------------------------
    async def expire(self) -> int:
        now = self._clock()
        moved = 0
        for tid in list(self._index.held):
            row = self._tasks[tid]
            if row.state in (C, R) and row.lease_deadline is not None and row.lease_deadline < now:
                outcome = rules.expired(row.owner, row.attempts, row.spec.max_attempts)
                self._apply(tid, row, outcome, now)
                moved += 1
        self._index.age(now, self._tasks)  # after the lapse: returned tasks catch up too
        for tid in [t for t in self._bids if self._tasks[t].state != P]:
            del self._bids[tid]
            self._auctions.pop(tid, None)
        self._sessions.forget_lapsed(now - 3600)
        if moved:
            self._touch()
        return moved

    async def end_session(self, expert: str, session: str) -> int:
        now = self._clock()
        if not self._sessions.end(expert, session, now):
            return 0
        moved = 0
        for tid in list(self._index.held):
            row = self._tasks[tid]
            if row.owner == expert and row.state in (C, R):
                outcome = rules.expired(
                    expert, row.attempts, row.spec.max_attempts, session_ended=True
                )
                self._apply(tid, row, outcome, now)
                moved += 1
        self._touch()
        return moved

    async def cancel(self, task_id: str) -> Task:
        now = self._clock()
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        self._apply(task_id, row, rules.cancelled(task_id, row.state, row.owner), now)
        self._touch()
        return task_of(task_id, row)

    async def retry(self, task_id: str) -> Task:
        now = self._clock()
        row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(task_id)
        self._apply(task_id, row, rules.retried(task_id, row.state), now)
        self._touch()
        return task_of(task_id, row)

    async def prune(self, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
        before, limit, keep_events = check_prune(before, limit, keep_events)
        gone = prunable(self._tasks, self._dependents, before, limit)
        for tid in gone:
            row = self._tasks.pop(tid)
            self._dependents.pop(tid, None)
            self._bids.pop(tid, None)
            self._auctions.pop(tid, None)
            if row.spec.key is not None and self._keys.get(row.spec.key) == tid:
                del self._keys[row.spec.key]
        cap_histories(self._tasks.values(), keep_events)
        if gone:
            self._touch(work=False)
        return len(gone)

    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        ttl = check_ttl(lease_ttl)
        now = self._clock()
        session, lapsed = self._sessions.register(info, now, ttl)
        if lapsed is not None:
            # The old session's claims end with it: a new session never inherits them.
            for row in self._tasks.values():
                if row.owner == info.id and row.state in (C, R) and row.lease_deadline is not None:
                    row.lease_deadline = min(row.lease_deadline, lapsed)
        return session

    async def deregister_expert(self, expert: str, session: str) -> None:
        self._sessions.deregister(expert, session, self._clock())

    # -- wake-ups --------------------------------------------------------------------------
    async def wait_for_change(self, timeout: float) -> None:
        """Return after the next change of the store, or after *timeout* seconds (``math.inf``:
        no timeout, and no timer)."""
        await self._changes.wait(timeout)

    async def wait_for_work(self, timeout: float) -> None:
        """Return after the next change that may have made a task claimable, or after
        *timeout* seconds (``math.inf``: none): not after a plain task's end, a progress
        report or a prune, which change nothing an idle expert could claim."""
        await self._changes.wait(timeout, work=True)


def _dispatches(store: MemoryStore) -> CentralDispatch:
    return store  # mypy checks here that MemoryStore implements central dispatch
