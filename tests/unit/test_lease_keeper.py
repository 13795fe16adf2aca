"""The lease keeper on a memory store and a fake clock: cadence, loss, a new session, stopping."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from contend import App, Expert, TaskState
from contend.errors import SchemaError, StoreError
from contend.runtime.hooks import Hooks
from contend.runtime.session import RATE_MARGIN, LeaseKeeper, Session
from contend.store.port import ExpertInfo, Heartbeat
from contend.testing import FakeClock
from tests.unit.fakes import Recorder, app_on, faulty_memory, running

TTL, EVERY = 3.0, 1.0


class Keeper:
    """A keeper with what it called back recorded."""

    def __init__(self, clock: FakeClock, every: float = EVERY) -> None:
        self.clock = clock
        self.store = faulty_memory(clock)
        self.hook = Recorder(clock)
        self.lost: list[tuple[float, Session]] = []
        self.renewed: list[tuple[Session, Mapping[str, int]]] = []
        self.keeper = LeaseKeeper(
            self.store,
            ExpertInfo("k"),
            ttl=TTL,
            every=every,
            clock=clock,
            hooks=Hooks([self.hook]),
            beat=lambda: Heartbeat(load=0),
            on_renewed=lambda s, held, sent: self.renewed.append((s, held)),
            on_lost=lambda s: self.lost.append((clock(), s)),
        )

    async def start(self) -> Session:
        session = await self.keeper.open()
        self.keeper.start()
        return session

    async def alive_in_store(self) -> bool:
        (rec,) = [e for e in await self.store.list_experts() if e.info.id == "k"]
        return rec.alive


@pytest.fixture
async def k() -> Keeper:
    return Keeper(FakeClock(0.0))


async def test_renews_on_a_fixed_cadence(k: Keeper) -> None:
    session = await k.start()
    await k.clock.run(10.5)
    assert k.hook.times("on_heartbeat") == [float(t) for t in range(1, 11)]
    assert k.store.calls["renew"] == 10
    assert all(s is session for s, _ in k.renewed)
    assert session.renewed_at == 10.0
    assert session.left() == pytest.approx(10.0 + TTL * (1 - RATE_MARGIN) - 10.5)
    (rec,) = await k.store.list_experts()
    assert rec.lease_deadline == 10.0 + TTL  # the store's deadline moved with every renewal
    await k.keeper.orphan()


async def test_a_new_sessions_first_renewals_come_sooner() -> None:
    # with a heartbeat of 5 s (a third of the default lease), rivals learned a newcomer's round trip (and it theirs) only after
    # 5-10 s; races among experts that did not know each other's lost a third of their claims
    clock = FakeClock(0.0)
    k = Keeper(clock, every=2.5)
    session = await k.start()
    await clock.run(12.5)
    beats = k.hook.times("on_heartbeat")
    assert beats == [1.0, 2.0, 4.5, 7.0, 9.5, 12.0]
    assert all(s is session for s, _ in k.renewed)
    await k.keeper.orphan()


async def test_renewals_failing_past_the_deadline_lose_the_session(k: Keeper) -> None:
    session = await k.start()
    await k.clock.run(2.5)  # renewed at 1 and 2
    k.store.cut("renew")
    deadline = 2.0 + TTL * (1 - RATE_MARGIN)  # the lease to 5, less the margin
    assert session.deadline == pytest.approx(deadline)
    await k.clock.run(deadline - 2.5 - 0.001)  # the tries at 3 and 4 fail: it still holds
    assert k.store.calls["renew"] == 4
    assert session.safe() and not session.lost.is_set() and k.lost == []
    await k.clock.run(0.001)  # the watchdog acts at the deadline, between two beats
    assert session.lost.is_set() and not session.safe()
    assert session.reason == "no renewal within the lease"
    assert k.lost == [(pytest.approx(deadline), session)]  # once
    # the store would count the old session live to 5: the keeper releases it, then opens a
    # new one at once (only renewals are cut)
    await k.clock.settle()
    new = k.keeper.session
    assert new is not None and new is not session and not new.lost.is_set()
    assert new.id != session.id and k.store.calls["deregister_expert"] == 1
    k.store.heal()
    await k.clock.run(3.0)
    assert [s for s, _ in k.renewed][-3:] == [new, new, new]
    assert len(k.lost) == 1
    await k.keeper.orphan()


async def test_a_registration_answered_late_is_renewed_before_use(k: Keeper) -> None:
    """A session's lease counts from when its registration was sent. After a PostgreSQL
    restart one was answered with 60 ms of a 2 s lease left: the expert claimed 8 tasks under
    it and the watchdog stopped them all 60 ms later."""
    k.store.hang("register_expert")
    opening = asyncio.create_task(k.keeper.open())
    await k.clock.run(2.6)  # of a lease of 3 s (2.94 s less the margin)
    k.store.heal()
    session = await opening
    assert k.store.calls.get("renew") == 1  # renewed before the keeper handed it out
    assert session.renewed_at == 2.6 and session.left() == pytest.approx(TTL * (1 - RATE_MARGIN))
    assert await k.alive_in_store()


async def test_a_late_registration_whose_renewal_fails_counts_as_failed(k: Keeper) -> None:
    k.store.hang("register_expert")
    opening = asyncio.create_task(k.keeper.open())
    await k.clock.run(2.6)
    k.store.heal()
    k.store.cut("renew")
    with pytest.raises(StoreError, match="answered a registration late"):
        await opening
    assert k.keeper.session is None and not k.keeper.ready.is_set()
    assert k.store.calls["deregister_expert"] == 1  # what it registered is let go
    assert not await k.alive_in_store()


async def test_a_late_registration_in_a_store_that_lost_its_schema_says_so(k: Keeper) -> None:
    k.store.hang("register_expert")
    opening = asyncio.create_task(k.keeper.open())
    await k.clock.run(2.6)
    k.store.heal()
    k.store.raise_on("renew", SchemaError("the store lost its contend tables"))
    with pytest.raises(SchemaError, match="lost its contend tables"):
        await opening  # not a StoreError to try again: the keeper gives up on it
    assert k.keeper.session is None


async def test_the_store_ending_the_session_loses_it_at_once(k: Keeper) -> None:
    session = await k.start()
    await k.clock.run(1.5)
    await k.store.deregister_expert("k", session.id)  # as if the store had expired it
    await k.clock.run(0.5)
    assert session.lost.is_set() and k.lost == [(2.0, session)]
    assert session.reason is not None and "not live" in session.reason  # the store's words
    new = k.keeper.session  # the store let the name go: a new session at once
    assert new is not session and new is not None and new.safe()
    await k.keeper.orphan()


async def test_any_part_may_declare_the_loss_and_it_happens_once(k: Keeper) -> None:
    session = await k.start()
    assert k.keeper.lose(session, "the claim loop heard LeaseLost")
    assert not k.keeper.lose(session, "the committer found it lapsed")
    assert k.lost == [(0.0, session)] and session.reason == "the claim loop heard LeaseLost"
    # the store still counts the old session live (to 3): the keeper alone releases it and
    # registers again, once — never against its own old session
    await k.clock.run(3.5)
    assert k.store.calls["deregister_expert"] == 1
    assert k.store.calls["register_expert"] == 2  # the first registration, and this one
    new = k.keeper.session
    assert new is not session and new is not None and new.safe()
    await k.keeper.orphan()


async def test_winding_down_opens_no_new_session(k: Keeper) -> None:
    session = await k.start()
    k.keeper.wind_down()
    await k.clock.run(1.5)
    assert k.hook.times("on_heartbeat") == [1.0]  # it still renews the session it has
    k.keeper.lose(session, "gone")
    await k.clock.run(5)
    assert k.keeper.session is session and k.store.calls["register_expert"] == 1  # the first
    await k.keeper.orphan()


async def test_orphan_stops_renewing_and_close_releases(k: Keeper) -> None:
    await k.start()
    await k.clock.run(1.5)
    await k.keeper.orphan()
    await k.clock.run(2.0)
    assert k.store.calls["renew"] == 1  # no renewal after orphan()
    assert await k.alive_in_store()  # the lease runs out on its own: to 1 + 3
    await k.clock.run(1.01)
    assert not await k.alive_in_store()
    other = Keeper(FakeClock(0.0))
    await other.start()
    await other.keeper.close()
    assert not await other.alive_in_store()  # released at once


async def test_an_expert_that_cannot_renew_stops_its_tasks_within_lease_and_one_beat() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app = app_on(store)
    hook = Recorder(clock)
    started, stopped = asyncio.Event(), asyncio.Event()

    @app.task
    async def long() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    expert = Expert(app, name="cut-off", lease_ttl=0.9, clock=clock, hooks=[hook])
    async with running(expert, clock):
        handle = await app.submit(long)
        assert await clock.run_until(started.is_set, limit=5)
        store.cut("renew", "complete", "fail", "checkpoint")
        cut_at = clock()
        assert await clock.run_until(stopped.is_set, limit=5)
        # the lease is 0.9 s and renewals every 0.3 s: it stops within lease + one beat
        assert clock() - cut_at <= 0.9 + 0.3
        assert expert.stats.leases_lost == 1
        ((name, reason, running_, dropped),) = hook.of("on_lease_lost")
        assert (name, running_, dropped) == ("cut-off", 1, 0)
        assert "no renewal" in reason
        ((_, task, why),) = hook.of("on_abandoned")
        assert task.id == handle.id and "lease" in why
        assert hook.of("after_execute") == []
        store.heal()
    task = await store.get(handle.id)
    assert task.state != TaskState.SUCCEEDED and store.calls.get("complete", 0) == 0


async def test_a_store_that_says_the_lease_is_gone_stops_the_expert_at_once() -> None:
    clock = FakeClock(0.0)
    store = faulty_memory(clock)
    app: App = app_on(store)
    stopped = asyncio.Event()

    @app.task
    async def long() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    expert = Expert(app, name="gone", lease_ttl=3.0, clock=clock)
    async with running(expert, clock):
        await app.submit(long)
        assert await clock.run_until(lambda: expert.load == 1, limit=5)
        session = expert.session
        assert session is not None
        await store.deregister_expert("gone", session.id)
        at = clock()
        assert await clock.run_until(stopped.is_set, limit=5)
        assert clock() - at <= 1.0 + 1e-9  # the next renewal hears LeaseLost
        assert expert.session is not session and expert.session is not None
        assert expert.stats.leases_lost == 1
