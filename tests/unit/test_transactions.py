"""A task's own transaction (``ctx.transaction()``) in the runtime, on the memory store and a
fake clock: the task is completed by the transaction and by nothing else; a body that raises, a
lost lease, a cancel and a conflict each roll it back whole; misuse gets a clear error."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contend import (
    App,
    ConfigError,
    Expert,
    FencedOut,
    PayloadError,
    TaskContext,
    TaskState,
    TransactionConflict,
)
from contend.domain.task import Capabilities
from contend.domain.transitions import IN_TRANSACTION
from contend.store.memory import MemoryStore, MemoryTransaction
from contend.store.port import Completion, ExpertInfo, Failure, Promises
from contend.store.sqlite import SQLiteTransaction
from contend.testing import FakeClock
from contend.testing.faults import FaultyStore
from tests.unit.fakes import Recorder, app_on, faulty_memory, running


class Setup:
    def __init__(self) -> None:
        self.clock = FakeClock(0.0)
        self.store: FaultyStore = faulty_memory(self.clock)
        self.memory: MemoryStore = self.store.inner  # type: ignore[assignment]
        self.app: App = app_on(self.store)
        self.hook = Recorder(self.clock)

    def expert(self, name: str = "x", **options: Any) -> Expert:
        options.setdefault("lease_ttl", 3.0)
        options.setdefault("heartbeat", 1.0)
        return Expert(self.app, name=name, clock=self.clock, hooks=[self.hook], **options)

    async def until(self, what: Any, limit: float = 30) -> None:
        assert await self.clock.run_until(what, limit=limit)

    async def state(self, task_id: str) -> TaskState:
        return (await self.store.get(task_id)).state


@pytest.fixture
def s() -> Setup:
    return Setup()


async def add(tx: MemoryTransaction, key: str = "n", by: int = 1) -> None:
    tx.put(key, int(await tx.get(key) or 0) + by)


async def test_the_transaction_completes_the_task_and_nothing_commits_it_again(
    s: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    after_block = asyncio.Event()

    @s.app.task
    async def bump(ctx: TaskContext, by: int) -> str:
        async with ctx.transaction(MemoryTransaction) as tx:
            await add(tx, by=by)
            tx.result = {"added": by}
        await after_block.wait()  # completed in the store; heartbeats pass meanwhile
        return "ignored"

    expert = s.expert()
    async with running(expert, s.clock):
        h = await s.app.submit(bump, [3])
        await s.until(lambda: s.memory.value("n") == 3)
        assert await s.state(h.id) == TaskState.SUCCEEDED
        await s.clock.run(5)  # renewals no longer list the task: the run is not stopped
        assert s.hook.of("on_abandoned") == [] and expert.load == 1
        after_block.set()
        await s.until(lambda: expert.load == 0)
    task = await s.store.get(h.id, history=True)
    assert task.result == {"added": 3}
    assert [(e.event, e.detail) for e in task.history if e.event == "succeeded"] == [
        ("succeeded", IN_TRANSACTION)
    ]
    assert s.store.calls.get("complete", 0) == 0  # the committer sent nothing for it
    ((_, _, outcome, _, error),) = s.hook.of("after_execute")
    assert isinstance(outcome, Completion) and outcome.result_json == '{"added":3}'
    assert error is None
    assert [o for _, o in s.hook.of("on_committed")] == [outcome]
    assert expert.stats.tasks_done == 1 and expert.stats.tasks_failed == 0
    assert "what it returned after its transaction committed is ignored" in caplog.text


async def test_a_body_that_raises_is_rolled_back_and_retried_the_usual_way(s: Setup) -> None:
    tries: list[int] = []

    @s.app.task(retries=1)
    async def flaky(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx)
            tries.append(ctx.attempt)
            if ctx.attempt == 1:
                raise ValueError("boom after the write")
            tx.result = ctx.attempt

    expert = s.expert()
    async with running(expert, s.clock):
        h = await s.app.submit(flaky)
        await s.until(lambda: expert.stats.tasks_done == 1)
    assert tries == [1, 2]
    assert s.memory.value("n") == 1  # the first attempt's write was rolled back
    task = await s.store.get(h.id, history=True)
    assert (task.state, task.result) == (TaskState.SUCCEEDED, 2)
    assert [e.event for e in task.history].count("retry") == 1
    assert expert.stats.tasks_failed == 1  # the failure took the usual way (committed)


async def test_a_lease_lost_inside_the_block_rolls_it_back_whole(s: Setup) -> None:
    inside = asyncio.Event()
    hang = [True]

    @s.app.task(retries=3)
    async def slow(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx)
            inside.set()
            while hang[0]:
                await asyncio.sleep(0.1)  # on the fake clock: stopped only by a cancel

    expert = s.expert()
    async with running(expert, s.clock):
        h = await s.app.submit(slow)
        await s.until(inside.is_set)
        session = expert.session
        assert session is not None
        s.store.hang("renew")  # the store hangs: no renewal gets an answer
        await s.until(session.lost.is_set)
        assert expert.load == 0
        assert s.memory.value("n") is None  # rolled back: nothing of the first run
        ((_, task, reason),) = s.hook.of("on_abandoned")
        assert task.id == h.id and "lease" in reason
        hang[0] = False
        s.store.heal()
        await s.until(lambda: expert.stats.tasks_done == 1, limit=60)
    task = await s.store.get(h.id, history=True)
    assert task.state == TaskState.SUCCEEDED and task.fence == 2
    assert s.memory.value("n") == 1  # exactly once


async def test_a_timeout_inside_the_block_rolls_it_back(s: Setup) -> None:
    @s.app.task(timeout=5, retries=0)
    async def too_slow(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx)
            await asyncio.sleep(60)

    expert = s.expert()
    async with running(expert, s.clock):
        h = await s.app.submit(too_slow)
        await s.until(lambda: expert.stats.tasks_failed == 1)
    task = await s.store.get(h.id)
    assert task.state == TaskState.DEAD and task.error["type"] == "Timeout"
    assert s.memory.value("n") is None


async def test_a_task_cancelled_inside_the_block_is_fenced_out_and_writes_nothing(
    s: Setup,
) -> None:
    inside, go_on = asyncio.Event(), asyncio.Event()
    seen: list[BaseException] = []

    @s.app.task
    async def cancelled(ctx: TaskContext) -> None:
        try:
            async with ctx.transaction() as tx:
                await add(tx)
                inside.set()
                await go_on.wait()
        except FencedOut as exc:
            seen.append(exc)
            raise

    # heartbeats rarely: the commit comes before the expert learns of the cancel
    expert = s.expert(lease_ttl=30.0, heartbeat=10.0)
    async with running(expert, s.clock):
        h = await s.app.submit(cancelled)
        await s.until(inside.is_set)
        await s.store.cancel(h.id)
        go_on.set()
        await s.until(lambda: bool(seen))
        await s.until(lambda: expert.load == 0)
    assert isinstance(seen[0], FencedOut) and seen[0].reason in ("not_owner", "not_owned")
    assert s.memory.value("n") is None
    assert (await s.store.get(h.id)).state == TaskState.CANCELLED
    assert expert.stats.tasks_done == 0


async def test_transact_runs_a_conflicting_transaction_again(s: Setup) -> None:
    first_read, second_done = asyncio.Event(), asyncio.Event()
    bodies: list[str] = []

    @s.app.task
    async def slow_reader(ctx: TaskContext) -> int:
        async def body(tx: MemoryTransaction) -> int:
            bodies.append("slow")
            n = int(await tx.get("n") or 0)
            if len(bodies) == 1:
                first_read.set()
                await second_done.wait()  # the other task commits meanwhile
            tx.put("n", n + 1)
            return n + 1

        return await ctx.transact(body)

    @s.app.task
    async def quick(ctx: TaskContext) -> None:
        await first_read.wait()
        await ctx.transact(add)
        second_done.set()

    expert = s.expert(concurrency=2)
    async with running(expert, s.clock):
        a = await s.app.submit(slow_reader)
        await s.app.submit(quick)
        await s.until(lambda: expert.stats.tasks_done == 2)
    assert bodies == ["slow", "slow"]  # the first try met the conflict and was run again
    assert s.memory.value("n") == 2
    assert (await s.store.get(a.id)).result == 2


async def test_a_conflict_left_unhandled_fails_the_run_and_writes_nothing(s: Setup) -> None:
    read, other_done = asyncio.Event(), asyncio.Event()

    @s.app.task(retries=0)
    async def conflicted(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx, by=10)
            read.set()
            await other_done.wait()

    @s.app.task
    async def other(ctx: TaskContext) -> None:
        await read.wait()
        await ctx.transact(add)
        other_done.set()

    expert = s.expert(concurrency=2)
    async with running(expert, s.clock):
        h = await s.app.submit(conflicted)
        await s.app.submit(other)
        await s.until(lambda: expert.stats.tasks_done + expert.stats.tasks_failed == 2)
    task = await s.store.get(h.id)
    assert task.state == TaskState.DEAD and task.error["type"] == "TransactionConflict"
    assert s.memory.value("n") == 1  # the other's write only


async def test_a_raise_after_the_committed_block_leaves_the_task_succeeded(
    s: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    @s.app.task
    async def raises_after(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx)
            tx.result = "done"
        raise RuntimeError("after the commit")

    expert = s.expert()
    async with running(expert, s.clock):
        h = await s.app.submit(raises_after)
        await s.until(lambda: expert.stats.tasks_done == 1)
    task = await s.store.get(h.id)
    assert (task.state, task.result) == (TaskState.SUCCEEDED, "done")
    assert s.store.calls.get("fail", 0) == 0 and expert.stats.tasks_failed == 0
    assert "raised RuntimeError('after the commit') after its transaction committed" in caplog.text


async def test_a_lease_lost_after_the_commit_reports_the_run_committed(s: Setup) -> None:
    committed, hold = asyncio.Event(), asyncio.Event()

    @s.app.task
    async def lingers(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx)
        committed.set()
        await hold.wait()

    expert = s.expert()
    async with running(expert, s.clock):
        await s.app.submit(lingers)
        await s.until(committed.is_set)
        session = expert.session
        assert session is not None
        s.store.hang("renew")
        await s.until(session.lost.is_set)
        s.store.heal()
        assert s.hook.of("on_abandoned") == []
        assert len(s.hook.of("on_committed")) == 1 and expert.stats.tasks_done == 1
        ((_, _, running_, _),) = s.hook.of("on_lease_lost")
        assert running_ == 0  # nothing of it was lost
    assert s.memory.value("n") == 1


async def test_a_transaction_opened_as_its_run_is_stopped_is_rolled_back(s: Setup) -> None:
    """The run is stopped in the very step its transaction opens, before it hears of it: the
    open transaction is not lost (on SQLite it would hold the write lock for good)."""
    rolled_back: list[MemoryTransaction] = []
    real_begin = s.memory.begin
    expert = s.expert()

    async def begin(name: str, task_id: str, fence: int) -> MemoryTransaction:
        tx = await real_begin(name, task_id, fence)
        real_rollback = tx.rollback

        async def rollback() -> None:
            rolled_back.append(tx)
            await real_rollback()

        tx.rollback = rollback  # type: ignore[method-assign]
        assert expert.parts is not None
        run = expert.parts.executor.runs[task_id]
        expert.parts.executor.abandon(run, "stopped as it opened")  # no await after this
        return tx

    s.memory.begin = begin  # type: ignore[method-assign]

    @s.app.task(retries=0)
    async def opens(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx)

    async with running(expert, s.clock):
        await s.app.submit(opens)
        await s.until(lambda: bool(rolled_back))
    assert len(rolled_back) == 1 and s.memory.value("n") is None
    assert [reason for _, _, reason in s.hook.of("on_abandoned")] == ["stopped as it opened"]


async def test_a_renewal_that_no_longer_lists_a_committing_task_does_not_stop_it(
    s: Setup,
) -> None:
    """The store completes the task as the commit lands; a renewal answered in that moment no
    longer lists it, and must not stop the run whose commit is landing."""
    landing, land = asyncio.Event(), asyncio.Event()
    real_begin = s.memory.begin

    async def begin(name: str, task_id: str, fence: int) -> MemoryTransaction:
        tx = await real_begin(name, task_id, fence)
        real_commit = tx.commit

        async def commit(completion: Completion) -> None:
            landing.set()
            await land.wait()
            await real_commit(completion)

        tx.commit = commit  # type: ignore[method-assign]
        return tx

    s.memory.begin = begin  # type: ignore[method-assign]

    @s.app.task
    async def lands(ctx: TaskContext) -> None:
        async with ctx.transaction() as tx:
            await add(tx)

    expert = s.expert()
    async with running(expert, s.clock):
        await s.app.submit(lands)
        await s.until(landing.is_set)
        assert expert.parts is not None
        # a renewal sent after the launch says: nothing is yours any more
        expert.parts.executor.retain({}, s.clock.monotonic() + 1.0)
        assert expert.load == 1
        land.set()
        await s.until(lambda: expert.stats.tasks_done == 1)
    assert s.hook.of("on_abandoned") == [] and s.memory.value("n") == 1


@pytest.mark.parametrize(
    "misuse, message",
    [
        ("sync", "async-only"),
        ("nested", "no nesting"),
        ("checkpoint", "ctx.checkpoint() inside ctx.transaction()"),
        ("twice", "completed by its transaction already"),
        ("kind", "this task's store gives a MemoryTransaction"),
    ],
)
async def test_misuse_gets_a_clear_error_and_writes_nothing(
    s: Setup, misuse: str, message: str
) -> None:
    @s.app.task(retries=0)
    def sync_task(ctx: TaskContext) -> None:
        with ctx.transaction():
            pass

    @s.app.task(retries=0)
    async def async_task(ctx: TaskContext, misuse: str) -> None:
        if misuse == "kind":
            async with ctx.transaction(SQLiteTransaction):
                pass
        async with ctx.transaction() as tx:
            await add(tx)
            if misuse == "nested":
                async with ctx.transaction():
                    pass
            if misuse == "checkpoint":
                await ctx.checkpoint({"step": 1})
        if misuse == "twice":
            async with ctx.transaction():
                pass

    expert = s.expert()
    async with running(expert, s.clock):
        if misuse == "sync":
            h = await s.app.submit(sync_task)
        else:
            h = await s.app.submit(async_task, [misuse])
        await s.until(lambda: bool(s.hook.of("after_execute")))
        await s.clock.run(1)
    ((_, _, outcome, _, error),) = s.hook.of("after_execute")
    if misuse == "twice":  # the first transaction stands; the error comes after it
        assert isinstance(outcome, Completion) and error is None
        assert s.memory.value("n") == 1
        assert (await s.store.get(h.id)).state == TaskState.SUCCEEDED
        return
    assert isinstance(outcome, Failure) and message in outcome.error_json
    assert s.memory.value("n") is None


async def test_a_store_without_transactions_refuses_with_config_error(s: Setup) -> None:
    class Plain(FaultyStore):
        promises = Promises()

    store = Plain(MemoryStore(clock=s.clock))
    app = app_on(store)
    errors: list[BaseException] = []

    @app.task
    async def wants_tx(ctx: TaskContext) -> None:
        try:
            async with ctx.transaction():
                pass
        except ConfigError as exc:
            errors.append(exc)

    expert = Expert(app, name="p", clock=s.clock, lease_ttl=3.0, heartbeat=1.0)
    async with running(expert, s.clock):
        await app.submit(wants_tx)
        assert await s.clock.run_until(lambda: bool(errors), limit=10)
    assert "gives tasks no transactions" in str(errors[0])


async def test_the_memory_transaction_is_optimistic() -> None:
    """Its reads are checked at commit: a key changed meanwhile is a conflict, not a lost
    update; its own writes read back; values are JSON."""
    clock = FakeClock(0.0)
    store = MemoryStore(clock=clock)
    app = App("memory://", store_factory=lambda url: store)

    @app.task
    async def t() -> None: ...

    await store.submit([app.build_spec(t, []), app.build_spec(t, [])])
    sid = await store.register_expert(ExpertInfo("e"), 10)
    a, b = await store.claim("e", sid, ["default"], Capabilities(), limit=2, lease_ttl=10)
    ta, tb = await store.begin("e", a.id, a.fence), await store.begin("e", b.id, b.fence)
    await add(ta)
    assert await ta.get("n") == 1  # its own write
    await add(tb)
    await tb.commit(Completion(b.id, b.fence, "null"))
    with pytest.raises(TransactionConflict):
        await ta.commit(Completion(a.id, a.fence, "null"))
    assert store.value("n") == 1
    assert (await store.get(a.id)).state == TaskState.RUNNING  # the claim still holds
    with pytest.raises(RuntimeError, match="has ended"):
        ta.put("n", 1)
    tc = await store.begin("e", a.id, a.fence)
    with pytest.raises(ConfigError):
        tc.put("", 1)
    with pytest.raises(PayloadError):
        tc.put("bad", float("nan"))
    await tc.rollback()
