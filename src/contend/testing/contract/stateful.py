"""A Hypothesis state machine that drives a store against a small pure-Python model.

Random submits, expert registrations, claims, renewals, clock jumps, expiries, owner writes
with current and stale fences (and by the wrong expert), cancels and retries. After every step
the store must agree with the model, and the invariants are checked on what the store reports:

* I1 a task reaches a committed terminal state at most once per claim (fence); a refused
  (fenced-out) write changes nothing;
* I2 nothing is lost: every task is terminal, pending, or claimed/running under a lease that is
  live or that ``expire`` will collect;
* I3 at most one owner per task, and a task's fence never goes down.

The async store is run from the synchronous machine on a private event loop.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from contend.domain.task import (
    Capabilities,
    Task,
    TaskSpec,
    TaskState,
    aged_priority,
    next_promotion,
    unaged,
)
from contend.errors import ExpertConflict, FencedOut, InvalidTransition, LeaseLost
from contend.store.port import ExpertInfo, Heartbeat
from contend.testing.contract.harness import BACKENDS
from contend.testing.contract.helpers import OWNER_WRITES, owner_write, snapshot

T = TypeVar("T")

P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING
OK, FAILED, DEAD, CANCELLED = (
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.DEAD,
    TaskState.CANCELLED,
)
TTL = 10.0


def exactly(t: float) -> Any:
    """Times on a fake clock: equal up to float rounding (approx's default is relative, which
    at epoch seconds would let through differences of half an hour)."""
    return pytest.approx(t, rel=0, abs=1e-6)


EXPERTS = ("a", "b", "c")
COMMIT_EVENTS = {"succeeded", "failed", "dead"}


@dataclass
class ModelTask:
    id: str
    priority: int
    max_attempts: int
    run_at: float
    state: TaskState = P
    attempts: int = 0
    fence: int = 0
    owner: str | None = None
    lease: float | None = None
    checkpoint: Any = None
    result: Any = None
    deps_open: set[str] = field(default_factory=set)  # while waiting: deps not yet succeeded
    if_failed: dict[str, str] = field(default_factory=dict)  # dependency -> its edge's choice
    created: float = 0.0
    aged: int = 0  # effective priority: stores raise it in expire() as the task waits
    promote_at: float = 0.0

    def __post_init__(self) -> None:
        self.aged, self.promote_at = unaged(self.priority, self.run_at)

    def due(self, at: float) -> None:
        """A new due time: the task's age restarts from it (if it changed)."""
        if at != self.run_at:
            self.run_at = at
            self.aged, self.promote_at = unaged(self.priority, at)


@dataclass
class ModelExpert:
    session: str
    deadline: float


@dataclass(frozen=True)
class Token:
    """What an expert got from a claim: it may still use it long after it went stale."""

    expert: str
    task_id: str
    fence: int


class StoreMachine(RuleBasedStateMachine):
    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory()
        self.cm = BACKENDS[self.backend].factory(Path(self.tmp.name))
        self.h = self.run(self.cm.__aenter__())
        self.s = self.h.store
        # A backend whose claims hang on the session's lease (etcd): a claimed task's lease is
        # its owner's session deadline, and the claims end when the session is deregistered.
        self.session_leases = bool(self.h.extra.get("session_leases"))
        self.ages_when_read = bool(self.h.extra.get("ages_when_read"))
        self.other = self.run(self.h.new_store())  # a second instance on the same data
        self.now = self.run(self.s.now())
        self.tasks: dict[str, ModelTask] = {}
        self.experts: dict[str, ModelExpert] = {}
        self.tokens: list[Token] = []
        self.fences_seen: dict[str, int] = {}
        self.counter = 0
        self.levels = False  # a task of a priority other than 0 was submitted: ageing writes
        self.touched: set[str] = (
            set()
        )  # tasks a step changed (or tried to): their history is checked

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.run(self.cm.__aexit__(None, None, None))
        finally:
            try:
                self._finish_tasks()
            finally:
                self.loop.close()
                self.tmp.cleanup()

    def _finish_tasks(self) -> None:
        """What asyncio.run does before it closes its loop: cancel the tasks still pending
        and let them end. A closed gRPC channel (etcd) leaves tasks that read a call's
        status; closed under them, the loop reported them as destroyed while pending, and
        pytest failed the example for those unraisable errors."""
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.run(asyncio.gather(*pending, return_exceptions=True))
        self.run(self.loop.shutdown_asyncgens())

    # -- model helpers -----------------------------------------------------------------------
    def live(self, name: str) -> bool:
        e = self.experts.get(name)
        return e is not None and e.deadline >= self.now

    def claimable(self) -> list[ModelTask]:
        ready = [t for t in self.tasks.values() if t.state == P and t.run_at <= self.now]
        if self.ages_when_read:  # the store reckons the age when it reads, no expire() needed
            return sorted(
                ready,
                key=lambda t: (-aged_priority(t.priority, self.now - t.run_at), t.run_at, t.id),
            )
        return sorted(ready, key=lambda t: (-t.aged, t.run_at, t.id))

    def task_json(self, task_id: str) -> dict[str, Any]:
        return self.run(self.s.get(task_id)).to_json()

    def via(self, other: bool) -> Any:
        return self.other if other else self.s

    def settle(self, task_id: str) -> None:
        """A task became terminal: release or kill the tasks that wait on it."""
        todo = [task_id]
        while todo:
            done = self.tasks[todo.pop()]
            for t in self.tasks.values():
                if t.state != W or done.id not in t.deps_open:
                    continue
                choice = t.if_failed.get(done.id, "fail")
                if done.state == OK or choice == "run":
                    t.deps_open.discard(done.id)
                    if not t.deps_open:
                        t.state = P
                        t.due(max(t.run_at, self.now))
                else:
                    t.state, t.deps_open = (CANCELLED if choice == "cancel" else DEAD), set()
                    todo.append(t.id)

    # -- rules -------------------------------------------------------------------------------
    @initialize(n=st.integers(1, 4))
    def start_with_two_experts_and_some_tasks(self, n: int) -> None:
        self.register("a")
        self.register("b")
        specs = [TaskSpec.build("job", [k], max_attempts=2) for k in range(n)]
        self.run(self.s.submit(specs))
        for x in specs:
            self.tasks[x.id] = ModelTask(x.id, 0, 2, self.now, created=self.now)

    @rule(
        data=st.data(),
        n=st.integers(1, 3),
        priority=st.sampled_from([-1, 0, 0, 2]),
        max_attempts=st.integers(1, 3),
        delay=st.sampled_from([0.0, 0.0, 5.0]),
        with_deps=st.booleans(),
    )
    def submit(
        self,
        data: st.DataObject,
        n: int,
        priority: int,
        max_attempts: int,
        delay: float,
        with_deps: bool,
    ) -> None:
        specs: list[TaskSpec] = []
        for k in range(n):
            known = sorted(self.tasks) + [x.id for x in specs]  # earlier members of the batch too
            deps: list[str] = []
            choices: list[str] = []
            if with_deps and known:
                deps = data.draw(st.lists(st.sampled_from(known), max_size=2, unique=True))
                # run mixed with fail or with cancel, not fail and cancel on one task: when both
                # of those dependencies die in one step, the first a store tells decides
                other = data.draw(st.sampled_from(["fail", "cancel"]))
                choices = [data.draw(st.sampled_from([other, "run"])) for _ in deps]
            specs.append(
                TaskSpec.build(
                    "job",
                    [k],
                    priority=priority,
                    max_attempts=max_attempts,
                    delay=delay,
                    depends_on=deps,
                    if_failed=choices,
                )
            )
            edges = dict(zip(deps, choices, strict=True))
            bad = [
                d
                for d in deps
                if self.tasks[d].state in (FAILED, DEAD, CANCELLED) and edges[d] != "run"
            ]
            waits = {d for d in deps if not self.tasks[d].state.terminal}
            t = ModelTask(specs[-1].id, priority, max_attempts, self.now + delay, created=self.now)
            self.levels = self.levels or priority != 0
            t.if_failed = edges
            if bad:
                t.state = CANCELLED if edges[bad[0]] == "cancel" else DEAD
            elif waits:
                t.state, t.deps_open = W, waits
            self.tasks[t.id] = t
        subs = self.run(self.s.submit(specs))
        assert [x.id for x in subs] == [x.id for x in specs]
        assert all(x.created for x in subs)

    @rule(name=st.sampled_from(EXPERTS))
    def register(self, name: str) -> None:
        info = ExpertInfo(id=name)
        if self.live(name):
            with pytest.raises(ExpertConflict):
                self.run(self.s.register_expert(info, TTL))
            return
        session = self.run(self.s.register_expert(info, TTL))
        old = self.experts.get(name)
        if old is not None:
            assert session != old.session
            for t in self.tasks.values():  # the old session's claims end with it
                if t.owner == name and t.state in (C, R) and t.lease is not None:
                    t.lease = min(t.lease, old.deadline)
        self.experts[name] = ModelExpert(session, self.now + TTL)

    @rule(name=st.sampled_from(EXPERTS))
    def deregister(self, name: str) -> None:
        e = self.experts.get(name)
        if e is None:
            return
        self.run(self.s.deregister_expert(name, e.session))
        e.deadline = min(e.deadline, self.now - 1e-6)
        if self.session_leases:
            for t in self.tasks.values():
                if t.owner == name and t.state in (C, R) and t.lease is not None:
                    t.lease = min(t.lease, e.deadline)

    @rule(
        name=st.sampled_from(EXPERTS),
        limit=st.integers(1, 3),
        start=st.booleans(),
        other=st.booleans(),
    )
    def claim(self, name: str, limit: int, start: bool, other: bool) -> None:
        session = self.experts[name].session if name in self.experts else "no-session"
        best = self.claimable()[:limit]
        peeked = self.run(self.via(other).peek(["default"], Capabilities(), limit))
        assert [v.id for v in peeked] == [t.id for t in best], "peek is not best first"
        call = self.via(other).claim(
            name, session, ["default"], Capabilities(), limit=limit, lease_ttl=TTL, start=start
        )
        if not self.live(name):
            with pytest.raises(LeaseLost):
                self.run(call)
            return
        got = self.run(call)
        event(f"claim got {len(got)}")
        expected = self.claimable()[:limit]
        assert sorted(c.id for c in got) == sorted(t.id for t in expected)
        for c in got:
            t = self.tasks[c.id]
            self.touched.add(t.id)
            lease = self.experts[name].deadline if self.session_leases else self.now + TTL
            t.state, t.owner, t.lease = (R if start else C), name, lease
            t.fence += 1
            t.attempts += 1
            assert (c.fence, c.attempt, c.checkpoint) == (t.fence, t.attempts, t.checkpoint)
            self.tokens.append(Token(name, c.id, c.fence))

    @rule(name=st.sampled_from(EXPERTS), other=st.booleans())
    def renew(self, name: str, other: bool) -> None:
        session = self.experts[name].session if name in self.experts else "no-session"
        call = self.via(other).renew(name, session, TTL, Heartbeat())
        if not self.live(name):
            with pytest.raises(LeaseLost):
                self.run(call)
            return
        held = self.run(call)
        expected = {}
        for t in self.tasks.values():
            if (
                t.owner == name
                and t.state in (C, R)
                and t.lease is not None
                and t.lease >= self.now
            ):
                t.lease = self.now + TTL
                expected[t.id] = t.fence
        self.experts[name].deadline = self.now + TTL
        assert held == expected

    @rule(seconds=st.sampled_from([0.5, 3.0, 6.0, 11.0]), then_expire=st.booleans())
    def advance(self, seconds: float, then_expire: bool) -> None:
        self.run(self.h.advance(seconds))
        self.now += seconds
        assert self.run(self.s.now()) == exactly(self.now)
        if then_expire:
            self.expire()

    @rule(name=st.sampled_from(EXPERTS), current=st.booleans(), other=st.booleans())
    def end_session(self, name: str, current: bool, other: bool) -> None:
        """A supervisor ends a session: every claim of the name expires now (or, for a
        session that is not the name's current one, nothing happens)."""
        e = self.experts.get(name)
        if e is None or not current:
            before = self.run(snapshot(self.s))
            assert self.run(self.via(other).end_session(name, "not-a-session")) == 0
            assert self.run(snapshot(self.s)) == before
            return
        moved = self.run(self.via(other).end_session(name, e.session))
        e.deadline = min(e.deadline, self.now - 1e-6)
        held = [t for t in self.tasks.values() if t.owner == name and t.state in (C, R)]
        event(f"end_session moved {min(moved, 2)}+")
        assert moved == len(held)
        self.lapse(held)

    def expire(self) -> None:
        moved = self.run(self.s.expire())
        event(f"expire moved {min(moved, 2)}+")
        lapsed = [
            t
            for t in self.tasks.values()
            if t.state in (C, R) and t.lease is not None and t.lease < self.now
        ]
        assert moved == len(lapsed)
        self.lapse(lapsed)
        if not self.levels:
            return  # every task has priority 0: ageing could not change their order
        for t in self.tasks.values():  # then ageing, on every task pending at that moment
            if t.state == P and t.promote_at <= self.now:
                t.aged = aged_priority(t.priority, self.now - t.run_at)
                t.promote_at = next_promotion(t.priority, t.aged, t.run_at)

    def lapse(self, tasks: list[ModelTask]) -> None:
        """The expiry rule on the model's tasks."""
        for t in tasks:
            self.touched.add(t.id)
            t.state = P if t.attempts < t.max_attempts else DEAD
            t.owner, t.lease = None, None
            if t.state == DEAD:
                self.settle(t.id)

    @precondition(lambda self: self.tokens)
    @rule(
        data=st.data(),
        op=st.sampled_from(OWNER_WRITES),
        retry_delay=st.sampled_from([None, 0.0, 4.0]),
        final_state=st.sampled_from([FAILED, DEAD]),
        other=st.booleans(),
    )
    def owner_write(
        self,
        data: st.DataObject,
        op: str,
        retry_delay: float | None,
        final_state: TaskState,
        other: bool,
    ) -> None:
        current = [
            tok
            for tok in self.tokens
            if self.tasks[tok.task_id].fence == tok.fence
            and self.tasks[tok.task_id].state in (C, R)
        ]
        if len(current) > 0 and data.draw(st.booleans(), label="by the current owner"):
            token = data.draw(st.sampled_from(current), label="token")
            writer = token.expert
        else:  # anything an expert was ever handed, possibly by another expert
            token = data.draw(st.sampled_from(self.tokens), label="token")
            writer = data.draw(st.sampled_from([token.expert, *EXPERTS]), label="writer")
        t = self.tasks[token.task_id]
        self.touched.add(t.id)
        self.counter += 1
        allowed = (C,) if op == "start" else (C, R)
        lands = (
            t.fence == token.fence
            and t.owner == writer
            and t.state in allowed
            and t.lease is not None
            and t.lease >= self.now
            and self.live(writer)  # an expert whose own lease lapsed commits nothing
        )
        if retry_delay is not None and t.attempts >= t.max_attempts:
            # the owner's retry policy decides (the last attempt is final); the store applies
            retry_delay, final_state = None, DEAD
        before = self.task_json(t.id)
        out = self.run(
            owner_write(
                self.via(other),
                op,
                writer,
                t.id,
                token.fence,
                result=self.counter,
                retry_delay=retry_delay,
                final_state=final_state,
                state={"n": self.counter},
            )
        )
        event(f"{op} {'lands' if lands else 'is fenced out'}")
        if not lands:
            assert isinstance(out, FencedOut), (op, token, writer, t)
            assert self.task_json(t.id) == before, "a fenced-out write changed the task"
            return
        assert out is None, (op, token, writer, t, out)
        if op == "start":
            t.state = R
        elif op == "checkpoint":
            t.checkpoint = {"n": self.counter}
        elif op == "progress":
            pass  # the model keeps no progress; a refused one must change nothing (above)
        elif op == "complete":
            t.state, t.result, t.owner, t.lease = OK, self.counter, None, None
            self.settle(t.id)
        elif op == "release":
            t.state, t.owner, t.lease = P, None, None
            t.attempts -= 1
        else:
            t.owner, t.lease = None, None
            if retry_delay is not None:
                t.state = P
                t.due(self.now + retry_delay)
            else:
                t.state = final_state
                self.settle(t.id)

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        t = self.tasks[data.draw(st.sampled_from(sorted(self.tasks)), label="task")]
        self.touched.add(t.id)
        if t.state in (W, P, C, R):
            assert self.run(self.s.cancel(t.id)).state == CANCELLED
            t.state, t.owner, t.lease = CANCELLED, None, None
            self.settle(t.id)
        else:
            before = self.task_json(t.id)
            with pytest.raises(InvalidTransition):
                self.run(self.s.cancel(t.id))
            assert self.task_json(t.id) == before

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        t = self.tasks[data.draw(st.sampled_from(sorted(self.tasks)), label="task")]
        self.touched.add(t.id)
        if t.state in (FAILED, DEAD, CANCELLED):
            assert self.run(self.s.retry(t.id)).state == P
            t.state, t.attempts, t.deps_open = P, 0, set()
            t.due(self.now)
        else:
            before = self.task_json(t.id)
            with pytest.raises(InvalidTransition):
                self.run(self.s.retry(t.id))
            assert self.task_json(t.id) == before

    # -- checks after every step -------------------------------------------------------------
    @invariant()
    def check_the_store(self) -> None:
        stored = {x.id: x for x in self.run(self.s.list_tasks(limit=100_000))}
        self.store_agrees_with_the_model(stored)
        self.stats_and_next_due_agree_with_the_model()
        self.nothing_is_lost(stored)
        self.one_owner_and_fences_only_grow(stored)
        self.at_most_one_commit_per_claim()

    def store_agrees_with_the_model(self, stored: dict[str, Task]) -> None:
        assert set(stored) == set(self.tasks), "a task was lost or invented"  # I2
        for tid, m in self.tasks.items():
            x = stored[tid]
            assert x.state == m.state, (tid, x.state, m)
            assert (x.fence, x.attempts, x.owner) == (m.fence, m.attempts, m.owner), (x, m)
            assert x.checkpoint == m.checkpoint
            assert x.result == m.result
            if m.lease is None:
                assert x.lease_deadline is None
            else:
                assert x.lease_deadline == exactly(m.lease)
            if m.state == P:
                assert x.run_at == exactly(m.run_at)

    def stats_and_next_due_agree_with_the_model(self) -> None:
        counts: dict[str, int] = {}
        for t in self.tasks.values():
            counts[str(t.state)] = counts.get(str(t.state), 0) + 1
        stats = self.run(self.s.stats())
        assert stats.counts == ({"default": counts} if counts else {})
        due = [t.run_at for t in self.tasks.values() if t.state == P]
        got = self.run(self.s.next_due(["default"]))
        assert got == (exactly(min(due)) if due else None)

    def nothing_is_lost(self, stored: dict[str, Task]) -> None:  # I2, from the store alone
        now = self.run(self.s.now())
        for x in stored.values():
            if x.state.terminal or x.state in (P, W):
                assert x.owner is None and x.lease_deadline is None, x
            else:
                assert x.state in (C, R) and x.owner is not None, x
                assert x.lease_deadline is not None, x  # live, or expire() collects it
                assert x.lease_deadline <= now + TTL + 1e-6, x
            if x.state == W:  # it waits on something that can still succeed
                deps = [stored[d].state for d in x.depends_on]
                assert any(not d.terminal for d in deps), (x.id, deps)
                # ... and every one that ended succeeded, or its edge lets the task run anyway
                ended = [d for d in x.depends_on if stored[d].state.terminal]
                assert all(stored[d].state == OK or x.if_failed_of(d) == "run" for d in ended), (
                    x.id,
                    deps,
                )

    def one_owner_and_fences_only_grow(self, stored: dict[str, Task]) -> None:  # I3
        for x in stored.values():
            assert x.fence >= self.fences_seen.get(x.id, 0), x
            self.fences_seen[x.id] = x.fence
            assert x.attempts <= x.max_attempts and x.attempts <= x.fence
        live_claims: dict[str, tuple[str, int]] = {}
        for tok in self.tokens:
            t = self.tasks[tok.task_id]
            if t.state in (C, R) and t.fence == tok.fence:
                assert live_claims.setdefault(tok.task_id, (tok.expert, tok.fence)) == (
                    tok.expert,
                    tok.fence,
                )

    def at_most_one_commit_per_claim(self) -> None:  # I1, on the tasks this step touched
        for tid in sorted(self.touched):
            history = self.run(self.s.get(tid, history=True)).history
            commits = [e.fence for e in history if e.event in COMMIT_EVENTS and e.expert]
            assert len(commits) == len(set(commits)), (tid, history)
            succeeded = [e for e in history if e.event == "succeeded"]
            assert len(succeeded) <= 1, (tid, history)
            if succeeded:
                assert self.tasks[tid].state == OK
        self.touched.clear()


def test_store_state_machine(contract_backend: str) -> None:
    """Runs once per registered backend on a fake clock (the plugin parametrizes it)."""
    backend = contract_backend
    machine = type(f"{backend.title()}StoreMachine", (StoreMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=60,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
