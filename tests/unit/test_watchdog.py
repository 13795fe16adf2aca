"""The lease watchdog on a memory store and a fake clock: a store that hangs instead of failing,
a store that stays down, a store that lost its schema, and sync runs told to stop."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from contend import App, Expert, SchemaError, TaskContext, TaskState, TaskStopped
from contend.errors import ExpertConflict, StoreError
from contend.runtime.executor import PATIENCE
from contend.runtime.hooks import Hooks
from contend.runtime.session import QUICK_PAUSE, REOPEN_CAP, LeaseKeeper, Session
from contend.store.port import ExpertInfo, Heartbeat
from contend.testing import FakeClock
from contend.testing.faults import FaultyStore
from tests.unit.fakes import Recorder, app_on, faulty_memory, running

#: Every call an expert makes, hung at once: a frozen connection, a held lock.
EVERYTHING = (
    "renew",
    "claim",
    "peek",
    "start",
    "steal",
    "complete",
    "fail",
    "checkpoint",
    "release",
    "expire",
    "register_expert",
    "deregister_expert",
    "list_experts",
    "backlog",
    "next_due",
    "now",
    "bid",
)
WRITES = ("claim", "start", "steal", "complete", "fail", "checkpoint", "release", "expire")


async def test_a_hanging_store_stops_every_task_at_the_deadline_and_commits_nothing() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    hook = Recorder(clock)
    gate = asyncio.Event()
    stopped_at: list[float] = []

    @app.task
    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped_at.append(clock())

    @app.task
    async def quick(ctx: TaskContext) -> int:
        await gate.wait()
        return ctx.fence

    expert = Expert(app, name="frozen", lease_ttl=3.0, heartbeat=1.0, clock=clock, hooks=[hook])
    async with running(expert, clock):
        long = await app.submit(forever)
        short = await app.submit(quick)
        assert await clock.run_until(lambda: expert.load == 2, limit=5)
        await clock.run(1.5)
        session = expert.session
        assert session is not None and session.safe()
        deadline = session.deadline  # the last renewal sent, plus the lease, less the margin
        store.hang(*EVERYTHING)
        gate.set()  # quick finishes now: its commit is sent, and hangs
        await clock.settle()
        assert store.hanging == 1  # the commit, waiting for ever (the next renewal will too)
        assert await clock.run_until(lambda: bool(stopped_at), limit=10)
        assert stopped_at == [pytest.approx(deadline)]  # at the deadline, to the tick
        assert session.lost.is_set() and expert.load == 0
        ((name, reason, stopped, _),) = hook.of("on_lease_lost")
        assert name == "frozen" and stopped == 1
        assert "lease" in reason
        assert [t.id for _, t, _ in hook.of("on_abandoned")] == [long.id]
        assert hook.of("on_committed") == []  # quick's result was not committed
        # a minute with everything hung: a new session is tried with back-off, each try bounded
        tries = store.calls["register_expert"]
        await clock.run(60)
        assert 4 <= store.calls["register_expert"] - tries <= 12
        assert expert.session is session  # nothing opened
        store.heal()
        assert await clock.run_until(
            lambda: expert.session is not session and not expert.session.lost.is_set(),
            limit=REOPEN_CAP + 5,
        )
        # the lapsed tasks come back to pending and are run again under the new session
        assert await clock.run_until(lambda: expert.stats.tasks_done == 1, limit=30)
    task = await store.get(short.id, history=True)
    assert task.state == TaskState.SUCCEEDED and task.result == 2  # the second run's fence
    assert [e.fence for e in task.history if e.event == "succeeded"] == [2]


async def test_a_commit_after_the_deadline_is_not_sent() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    gate = asyncio.Event()

    @app.task
    async def late() -> str:
        await gate.wait()
        return "late"

    expert = Expert(app, name="late", lease_ttl=3.0, heartbeat=1.0, clock=clock)
    async with running(expert, clock):
        await app.submit(late)
        assert await clock.run_until(lambda: expert.load == 1, limit=5)
        session = expert.session
        assert session is not None
        store.hang("renew")  # only the renewal hangs: everything else would go through
        assert await clock.run_until(session.lost.is_set, limit=10)
        assert clock() == pytest.approx(session.deadline)
        assert expert.load == 0  # stopped
        before = dict(store.calls)
        gate.set()  # far too late: the run was stopped, its result goes nowhere
        await clock.settle()
        assert store.calls.get("complete", 0) == before.get("complete", 0)
        store.heal()


class Keeper:
    """A lease keeper alone, with a deterministic jitter (half way)."""

    def __init__(self) -> None:
        self.clock = FakeClock(0.0)
        self.store: FaultyStore = faulty_memory(self.clock)
        self.lost: list[tuple[float, Session]] = []
        self.keeper = LeaseKeeper(
            self.store,
            ExpertInfo("k"),
            ttl=3.0,
            every=1.0,
            clock=self.clock,
            hooks=Hooks([Recorder(self.clock)]),
            beat=lambda: Heartbeat(),
            on_renewed=lambda s, held, sent: None,
            on_lost=lambda s: self.lost.append((self.clock(), s)),
            rand=lambda: 0.5,
        )

    async def start(self) -> Session:
        session = await self.keeper.open()
        self.keeper.start()
        return session


#: Tries to open a session after a loss at 0 while the store refuses, one a pause apart, times
#: 0.75 (the jitter, half way): a heartbeat (1 s, at most QUICK_PAUSE) for QUICK_REOPEN, then
#: doubling from a heartbeat to REOPEN_CAP.
BACKED_OFF = [0.75 * k for k in range(40)] + [30.0, 30.75, 32.25, 35.25, 41.25, 48.75, 56.25]
#: The tries of those that are logged: the first, then one in QUICK_LOG_EVERY while the tries
#: are quick, then every one.
LOGGED = [0.0, 10.5, 21.0, 30.0, 30.75, 32.25, 35.25, 41.25, 48.75, 56.25]


@pytest.mark.parametrize(
    "refusal",
    [
        pytest.param(None, id="store-down"),
        pytest.param(ExpertConflict("expert id 'k' is live elsewhere"), id="conflict"),
    ],
)
async def test_a_store_that_refuses_a_new_session_is_tried_with_capped_back_off(
    refusal: ExpertConflict | None, caplog: pytest.LogCaptureFixture
) -> None:
    k = Keeper()
    session = await k.start()
    if refusal is None:
        k.store.cut("register_expert")  # etcd killed: every try fails at once
    else:
        k.store.raise_on("register_expert", refusal)
    tried: list[float] = []
    real = k.store.inner.register_expert

    async def counted(info: ExpertInfo, ttl: float) -> str:
        tried.append(k.clock())
        return await real(info, ttl)

    k.store.inner.register_expert = counted  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger="contend.expert")
    k.keeper.lose(session, "the store ended it")
    await k.clock.run(60)
    attempts = k.store.calls["register_expert"] - 1  # less the first registration
    assert attempts == len(BACKED_OFF)  # not 22,402 lines in 7 s
    lines = [r for r in caplog.records if "could not register" in r.getMessage()]
    assert len(lines) == len(LOGGED)
    assert [r.levelno for r in lines[:2]] == [logging.ERROR, logging.WARNING]
    assert tried == []  # none reached the store
    k.store.heal()
    await k.clock.run(REOPEN_CAP)
    assert k.keeper.session is not session and k.keeper.session is not None
    assert k.keeper.session.safe() and tried == [pytest.approx(56.25 + 7.5)]
    assert len(k.lost) == 1
    await k.keeper.orphan()


async def test_a_store_back_soon_after_a_loss_gets_a_new_session_within_a_pause() -> None:
    """A store restart or a failover lasts seconds. With the pause doubling from the first
    try, the new session came up to REOPEN_CAP after the store was back (11.25 s for a store
    back at 6 s, here); while a loss is young, the tries stay a heartbeat apart."""
    k = Keeper()
    session = await k.start()
    k.store.cut("register_expert")
    k.keeper.lose(session, "the store ended it")
    await k.clock.run(6.0)
    k.store.heal()
    await k.clock.run(QUICK_PAUSE)
    new = k.keeper.session
    assert new is not None and new is not session and new.safe()
    assert k.store.calls["register_expert"] - 1 == 10  # at 0, 0.75, ... 6.0 (every 0.75 s)
    await k.keeper.orphan()


async def test_one_loss_seen_by_every_part_registers_once_never_against_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    done = asyncio.Event()

    @app.task
    async def finishing() -> str:
        await done.wait()
        return "ok"

    caplog.set_level(logging.INFO, logger="contend.expert")
    expert = Expert(app, name="p0", lease_ttl=3.0, heartbeat=1.0, clock=clock)
    async with running(expert, clock):
        await app.submit(finishing)
        assert await clock.run_until(lambda: expert.load == 1, limit=5)
        session = expert.session
        assert session is not None
        store.cut("renew")  # the store is fine otherwise, and still counts the session live
        await clock.run(session.left() - 0.01)
        done.set()  # the commit and the watchdog meet at the deadline
        registrations = store.calls["register_expert"]
        await clock.run(0.02)
        assert session.lost.is_set()
        await clock.run(2.0)
        assert store.calls["register_expert"] == registrations + 1  # one new session
        assert store.calls["deregister_expert"] == 1  # the lost one released first
        store.heal()
    assert not [r for r in caplog.records if "live elsewhere" in r.getMessage()]
    assert expert.stats.leases_lost == 1


async def test_a_store_that_lost_its_schema_stops_the_expert_and_gets_no_writes() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)

    @app.task
    async def forever() -> None:
        await asyncio.Event().wait()

    expert = Expert(app, name="s", lease_ttl=3.0, heartbeat=1.0, clock=clock)
    runner = asyncio.create_task(expert.run())
    await app.submit(forever)
    assert await clock.run_until(lambda: expert.load == 1, limit=5)
    store.raise_on("renew", SchemaError("the store holds no contend schema any more"))
    assert await clock.run_until(lambda: expert.error is not None, limit=5)
    writes = {op: store.calls.get(op, 0) for op in (*WRITES, "register_expert")}
    assert await clock.run_until(runner.done, limit=60)
    with pytest.raises(SchemaError, match="no contend schema"):
        await runner
    assert {op: store.calls.get(op, 0) for op in writes} == writes
    assert store.calls.get("deregister_expert", 0) == 0
    assert expert.load == 0


async def test_a_sync_run_is_told_to_stop_and_its_result_is_thrown_away() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app: App = app_on(store)
    started, stopped = threading.Event(), threading.Event()
    seen: list[str] = []

    @app.task
    def crunch(ctx: TaskContext) -> str:
        started.set()
        try:
            while True:
                ctx.check()
                stopped.wait(0.001)  # one step of cooperative work
        except TaskStopped as exc:
            seen.append(str(exc))
            stopped.set()
            return "a result nobody will see"

    expert = Expert(app, name="sync", lease_ttl=3.0, heartbeat=1.0, clock=clock)
    async with running(expert, clock):
        handle = await app.submit(crunch)
        assert await asyncio.to_thread(started.wait, 5)
        session = expert.session
        assert session is not None
        store.hang("renew")
        assert await clock.run_until(session.lost.is_set, limit=10)
        assert await asyncio.to_thread(stopped.wait, 5)
        await clock.settle()
        assert store.calls.get("complete", 0) == 0
        store.heal()
    assert len(seen) == 1 and "must stop" in seen[0] and "lease" in seen[0]
    assert (await store.get(handle.id)).state != TaskState.SUCCEEDED


async def test_a_checkpoint_rides_out_a_short_outage_within_the_lease() -> None:
    """An etcd restart of 0.8 s failed the checkpoints of the tasks running then: each task's
    attempt failed, and its next one waited out the retry back-off (20 s in the chaos suite).
    A task's checkpoint is tried again while the store cannot be reached, for up to a lease."""
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    saved: list[float] = []

    @app.task
    async def saves(ctx: TaskContext) -> int:
        await ctx.checkpoint({"step": 1})
        saved.append(clock())
        return ctx.attempt

    expert = Expert(app, name="patient", lease_ttl=3.0, heartbeat=1.0, clock=clock)
    async with running(expert, clock):
        store.cut("checkpoint")
        handle = await app.submit(saves)
        assert await clock.run_until(lambda: store.calls.get("checkpoint", 0) >= 3, limit=2)
        assert saved == []
        store.heal()
        assert await clock.run_until(lambda: expert.stats.tasks_done == 1, limit=3)
    task = await store.get(handle.id)
    assert task.state == TaskState.SUCCEEDED and task.result == 1  # its first attempt
    assert task.checkpoint == {"step": 1}


@pytest.mark.parametrize(
    "fault", ["unreachable", "refused"], ids=["unreachable for good", "a refusal"]
)
async def test_a_checkpoint_gives_up_after_its_patience_or_at_once(fault: str) -> None:
    """A store that stays unreachable while the lease holds (its renewals go through) fails
    the checkpoint after PATIENCE; any other error of the store fails it at once."""
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    raised: list[tuple[float, str]] = []

    @app.task(retries=0)
    async def saves(ctx: TaskContext) -> None:
        began = clock()
        try:
            await ctx.checkpoint({"step": 1})
        except Exception as exc:
            raised.append((clock() - began, type(exc).__name__))
            raise

    expert = Expert(app, name="patient", lease_ttl=3.0, heartbeat=1.0, clock=clock)
    async with running(expert, clock):
        if fault == "unreachable":
            store.cut("checkpoint")
        else:
            store.raise_on("checkpoint", StoreError("the store refuses checkpoints"))
        handle = await app.submit(saves)
        assert await clock.run_until(lambda: bool(raised), limit=PATIENCE + 5)
        store.heal()
        await clock.run(1.0)  # its failure is committed
    ((took, kind),) = raised
    if fault == "unreachable":
        assert kind == "StoreUnavailable" and PATIENCE - 1.5 <= took <= PATIENCE
    else:
        assert kind == "StoreError" and took == 0
    assert (await store.get(handle.id)).state == TaskState.DEAD
