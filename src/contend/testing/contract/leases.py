"""The store contract: Leases: renew and expire; experts and what they report.

Times are moved with ``harness.advance``; leases use ``harness.ttl``. Nothing here sleeps to
synchronise: wake-ups are awaited with a deadline.
"""

from __future__ import annotations

import pytest

from contend.errors import (
    ExpertConflict,
    FencedOut,
    LeaseLost,
)
from contend.store.port import ExpertInfo, Heartbeat
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import (
    CANCELLED,
    DEAD,
    P,
    caps,
    join,
    snapshot,
    spec,
    state_of,
)

# -- leases: renew and expire ------------------------------------------------------------------


async def test_renew_extends_the_leases_and_returns_the_held_tasks(harness: Harness) -> None:
    s = harness.store
    a, b, c = spec(), spec(), spec()
    await s.submit([a, b, c])
    e1, e2 = await join(harness, "e1"), await join(harness, "e2")
    ca, cb = await e1.claim(2, start=False)
    await e2.claim_one()
    assert await e1.write("start", ca.id, ca.fence) is None
    await harness.advance(harness.ttl * 0.75)
    held = await e1.renew()
    assert held == {ca.id: ca.fence, cb.id: cb.fence}
    now = await s.now()
    for tid in (ca.id, cb.id):
        assert (await s.get(tid)).lease_deadline == harness.at(now + harness.ttl)
    await harness.advance(harness.ttl * 0.75)  # past the first deadline, within the renewed one
    assert await s.expire() == 1  # e2's task, not renewed
    assert await e1.write("complete", ca.id, ca.fence) is None
    assert await e1.renew() == {cb.id: cb.fence}


async def test_renew_after_the_lease_lapsed_raises_lease_lost_and_never_revives(
    harness: Harness,
) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    await harness.advance(harness.ttl * 2)
    with pytest.raises(LeaseLost):
        await e.renew()
    with pytest.raises(LeaseLost):  # still lost: a failed renew does not half-revive it
        await e.renew()
    task = await s.get(t.id)
    assert task.lease_deadline is not None and task.lease_deadline < await s.now()
    assert isinstance(await e.write("complete", t.id, c.fence), FencedOut)
    assert await s.expire() == 1
    assert await state_of(s, t.id) == P
    experts = {x.info.id: x for x in await s.list_experts()}
    assert not experts["e1"].alive


async def test_a_new_session_does_not_inherit_the_claims_of_a_lapsed_one(
    harness: Harness,
) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    old = await join(harness)
    await harness.advance(harness.ttl * 0.5)
    c = await old.claim_one()
    await harness.advance(harness.ttl * 0.6)  # the session lapsed; the task's deadline has not
    with pytest.raises(LeaseLost):
        await old.renew()
    new = await join(harness, old.name)
    assert await new.renew() == {}
    assert isinstance(await new.write("complete", t.id, c.fence), FencedOut)
    await harness.advance(harness.ttl)
    await new.renew()
    assert await s.expire() == 1
    task = await s.get(t.id)
    assert (task.state, task.owner) == (P, None)
    again = await new.claim_one()
    assert again.fence == c.fence + 1


async def test_renew_with_a_stale_session_raises_lease_lost(harness: Harness) -> None:
    e = await join(harness)
    await harness.advance(harness.ttl * 2)
    e_again = await join(harness)  # same name, new session
    with pytest.raises(LeaseLost):
        await e.renew()
    assert await e_again.renew() == {}


async def test_a_cancelled_task_leaves_renew_and_its_owner_is_fenced_out(harness: Harness) -> None:
    s = harness.store
    a, b = spec(), spec()
    await s.submit([a, b])
    e = await join(harness)
    ca, cb = await e.claim(2)
    cancelled = await s.cancel(ca.id)
    assert cancelled.state == CANCELLED and cancelled.owner is None
    assert await e.renew() == {cb.id: cb.fence}
    before = await snapshot(s)
    assert isinstance(await e.write("complete", ca.id, ca.fence), FencedOut)
    assert isinstance(await e.write("checkpoint", ca.id, ca.fence), FencedOut)
    assert await snapshot(s) == before


async def test_expire_returns_lapsed_tasks_to_pending_keeping_the_checkpoint(
    harness: Harness,
) -> None:
    s = harness.store
    t, fresh = spec(max_attempts=3), spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    assert await e.write("checkpoint", t.id, c.fence, state={"page": 7}) is None
    assert await s.expire() == 0
    await harness.advance(harness.ttl * 0.5)
    await s.submit([fresh])
    assert await s.expire() == 0
    await harness.advance(harness.ttl)
    assert await s.expire() == 1
    task = await s.get(t.id)
    assert (task.state, task.owner, task.lease_deadline) == (P, None, None)
    assert (task.attempts, task.fence, task.checkpoint) == (1, 1, {"page": 7})
    assert await s.expire() == 0
    e2 = await join(harness, "e2")
    got = await e2.claim(5)
    again = next(x for x in got if x.id == t.id)
    assert (again.checkpoint, again.fence, again.attempt) == ({"page": 7}, 2, 2)


async def test_expire_makes_a_task_dead_when_its_attempts_are_spent(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=1)
    await s.submit([t])
    e = await join(harness)
    await e.claim_one()
    await harness.advance(harness.ttl * 2)
    assert await s.expire() == 1
    task = await s.get(t.id)
    assert (task.state, task.owner, task.attempts) == (DEAD, None, 1)
    assert task.error is not None
    assert await (await join(harness, "e2")).claim(5) == []


# -- experts ---------------------------------------------------------------------------------


async def test_register_expert_conflicts_while_live_and_is_allowed_after_lapse(
    harness: Harness,
) -> None:
    s = harness.store
    first = await join(harness, "alice")
    with pytest.raises(ExpertConflict, match="alice"):
        await join(harness, "alice")
    await harness.advance(harness.ttl * 0.6)
    await first.renew()
    await harness.advance(harness.ttl * 0.6)
    with pytest.raises(ExpertConflict):  # renewed: still live
        await join(harness, "alice")
    await harness.advance(harness.ttl * 0.6)
    second = await join(harness, "alice")
    assert second.session != first.session
    alive = {x.info.id: x.alive for x in await s.list_experts()}
    assert alive == {"alice": True}


async def test_deregister_frees_the_expert_id(harness: Harness) -> None:
    s = harness.store
    e = await join(harness, "bob")
    await s.deregister_expert("bob", e.session)
    with pytest.raises(LeaseLost):
        await e.renew()
    await join(harness, "bob")


# -- experts and history as reported -------------------------------------------------------------


async def test_list_experts_reports_what_experts_publish(harness: Harness) -> None:
    s = harness.store
    info = ExpertInfo(
        id="gpu-1",
        capabilities=caps("gpu", "zone:eu", mem_gb=16),
        queues=("default", "render"),
        capacity=4,
        tier="specialized",
        host="node-7",
        pid=4242,
    )
    session = await s.register_expert(info, harness.ttl)
    await harness.advance(1)
    beat = Heartbeat(load=3, claim_attempts=10, claims_won=8, tasks_done=5)
    assert await s.renew("gpu-1", session, harness.ttl, beat) == {}
    (rec,) = await s.list_experts()
    assert rec.info == info
    assert (rec.session, rec.alive, rec.load) == (session, True, 3)
    assert (rec.claim_attempts, rec.claims_won, rec.tasks_done) == (10, 8, 5)
    now = await s.now()
    assert rec.heartbeat_at == harness.at(now)
    assert rec.lease_deadline == harness.at(now + harness.ttl)
    assert rec.started_at == harness.at(now - 1)
    competition = (await s.stats()).to_json()["competition"]
    assert competition == {"claim_attempts": 10, "claims_won": 8, "success_rate": 0.8}
    await s.deregister_expert("gpu-1", session)
    (rec,) = await s.list_experts()
    assert not rec.alive and rec.load == 0


async def test_history_tells_the_life_of_a_task(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=5)
    await s.submit([t])
    e = await join(harness)
    c1 = await e.claim_one()
    await e.write("fail", t.id, c1.fence, retry_delay=0.0)
    c2 = await e.claim_one()
    await e.write("release", t.id, c2.fence)
    c3 = await e.claim_one(start=False)
    await e.write("start", t.id, c3.fence)
    await harness.advance(harness.ttl * 2)
    await s.expire()
    e2 = await join(harness, "e2")
    c4 = await e2.claim_one()
    await e2.write("complete", t.id, c4.fence)
    history = (await s.get(t.id, history=True)).history
    assert (await s.get(t.id)).history == ()
    steps = [(h.event, h.fence) for h in history if h.event != "submitted"]
    assert steps == [
        ("claimed", 1),
        ("retry", 1),
        ("claimed", 2),
        ("released", 2),
        ("claimed", 3),
        ("started", 3),
        ("expired", 3),
        ("claimed", 4),
        ("succeeded", 4),
    ]
    assert [h.expert for h in history if h.event == "claimed"] == ["e1", "e1", "e1", "e2"]
    times = [h.at for h in history]
    assert times == sorted(times)
