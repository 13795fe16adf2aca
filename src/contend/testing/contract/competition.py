"""The store operations behind competition: auctions, work stealing, backlog, heartbeat metrics.

Part of the contract: every backend registered in ``backends.py`` must pass it.
"""

from __future__ import annotations

import pytest

from contend.domain.task import TaskState
from contend.errors import ConfigError, LeaseLost, TaskNotFound
from contend.store.port import Heartbeat
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import Expert, caps, spec


async def join(h: Harness, name: str) -> Expert:
    return await Expert.join(h.store, name, h.ttl)


async def test_bids_are_ranked_and_the_auction_closes_on_the_store_clock(harness: Harness) -> None:
    h = harness
    (sub,) = await h.store.submit([spec("render")])
    a, b, c = [await join(h, n) for n in ("a", "b", "c")]
    window = h.ttl / 2
    first = await h.store.bid("a", a.session, sub.id, 0.5, window)
    assert first.open
    assert first.closes_at == h.at(first.now + window)
    await h.store.bid("b", b.session, sub.id, 0.9, window * 3)  # a later bid does not move it
    last = await h.store.bid("c", c.session, sub.id, 0.9, window)
    assert last.closes_at == h.at(first.closes_at)
    assert [name for name, _ in last.bids] == ["b", "c", "a"]  # best score, then earliest
    assert last.may_claim_at("b", 1.0) == last.closes_at
    assert last.may_claim_at("a", 1.0) == last.closes_at + 2.0
    assert last.may_claim_at("stranger", 1.0) == last.closes_at + 3.0
    raised = await h.store.bid("a", a.session, sub.id, 0.95, window)
    assert raised.bids[0] == ("a", 0.95)


async def test_the_store_keeps_the_auction_order(harness: Harness) -> None:
    # the order used to be kept only by cooperating experts: the store granted a lower
    # bidder's claim during the winner's grace, and anyone's claim before the close
    h = harness
    (sub,) = await h.store.submit([spec("render")])
    (other,) = await h.store.submit([spec("render")])
    a, b, c = [await join(h, n) for n in ("a", "b", "c")]
    window, grace = h.ttl / 4, h.ttl / 4
    opened = await h.store.bid("a", a.session, sub.id, 0.9, window, grace)
    assert opened.grace == grace
    ranked = await h.store.bid("b", b.session, sub.id, 0.5, window, grace * 3)
    assert ranked.grace == grace  # the first bid fixed it
    assert ranked.may_claim_at("b") == ranked.closes_at + grace

    async def claims(e: Expert) -> set[str]:
        named = {t.id for t in await e.claim(task_ids=[sub.id])}
        for t in await e.claim(5):  # a plain claim skips it too
            assert t.id == other.id, "a held-back task was claimed"
            assert await h.store.release(e.name, [(t.id, t.fence)]) == [None]
        return named

    for e in (a, b, c):  # the window is open: nobody, not even the top bidder
        assert await claims(e) == set()
    await h.advance(window + h.tolerance)
    late = await h.store.bid("c", c.session, sub.id, 1.0, window, grace)
    assert [name for name, _ in late.bids] == ["a", "b"]  # sealed at the close
    for e in (b, c):  # the winner's grace: only 'a'
        assert await claims(e) == set()
    await h.advance(grace)
    assert await claims(c) == set()  # 'b' has its turn before anyone else
    assert await claims(b) == {sub.id}


async def test_the_top_bidder_claims_at_the_close(harness: Harness) -> None:
    h = harness
    (sub,) = await h.store.submit([spec("render")])
    a, b = [await join(h, n) for n in ("a", "b")]
    await h.store.bid("b", b.session, sub.id, 0.4, h.ttl / 4)
    await h.store.bid("a", a.session, sub.id, 0.8, h.ttl / 4)
    await h.advance(h.ttl / 4 + h.tolerance)
    assert await b.claim(task_ids=[sub.id]) == []
    assert [t.id for t in await a.claim(task_ids=[sub.id])] == [sub.id]


async def test_a_bid_on_a_task_that_is_not_pending_says_so(harness: Harness) -> None:
    h = harness
    (sub,) = await h.store.submit([spec("render")])
    a = await join(h, "a")
    await h.store.bid("a", a.session, sub.id, 0.5, 0.0)  # closes at once: 'a' ranks first
    (got,) = await a.claim(task_ids=[sub.id])
    closed = await h.store.bid("a", a.session, sub.id, 0.5, 1.0)
    assert not closed.open and closed.bids == ()
    assert await h.store.expire() == 0  # housekeeping clears the stale auction, moves nothing
    assert (await h.store.get(got.id)).owner == "a"


async def test_bids_need_a_known_task_a_live_session_and_a_sane_score(harness: Harness) -> None:
    h = harness
    (sub,) = await h.store.submit([spec("render")])
    a = await join(h, "a")
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="score"):
            await h.store.bid("a", a.session, sub.id, bad, 1.0)
    with pytest.raises(ConfigError, match="window"):
        await h.store.bid("a", a.session, sub.id, 0.5, -1.0)
    for bad_grace in (0, -1.0, float("inf"), 601.0):
        with pytest.raises(ConfigError, match="grace"):
            await h.store.bid("a", a.session, sub.id, 0.5, 1.0, bad_grace)
    assert (await h.store.get(sub.id)).state == TaskState.PENDING
    with pytest.raises(TaskNotFound):
        await h.store.bid("a", a.session, "no-such-task", 0.5, 1.0)
    await h.advance(h.ttl * 1.5)
    with pytest.raises(LeaseLost):
        await h.store.bid("a", a.session, sub.id, 0.5, 1.0)


async def test_steal_takes_the_best_unstarted_tasks_and_fences_out_the_victim(
    harness: Harness,
) -> None:
    h = harness
    await h.store.submit([spec("t", priority=p) for p in (1, 2, 3, 4)])
    victim, thief = await join(h, "victim"), await join(h, "thief")
    (running,) = await victim.claim(1)
    ahead = await victim.claim(3, start=False)
    stolen = await h.store.steal(
        "thief", thief.session, "victim", ["default"], caps(), limit=2, lease_ttl=h.ttl
    )
    assert sorted(c.priority for c in stolen) == [2, 3]  # the best of the unstarted ones
    assert running.id not in {c.id for c in stolen}
    for c in stolen:
        task = await h.store.get(c.id)
        assert (task.owner, task.state, task.fence, task.attempts) == (
            "thief",
            TaskState.RUNNING,
            2,
            1,
        )
        assert c.fence == 2
    results = await h.store.start("victim", [(c.id, c.fence) for c in ahead])
    started = [c for c, r in zip(ahead, results, strict=True) if r is None]
    assert [c.priority for c in started] == [1]
    assert (
        await h.store.steal(
            "thief", thief.session, "victim", ["default"], caps(), limit=5, lease_ttl=h.ttl
        )
        == []
    )


async def test_steal_respects_requirements_and_a_live_session(harness: Harness) -> None:
    h = harness
    await h.store.submit([spec("t", requirements=["gpu"])])
    victim = await Expert.join(h.store, "victim", h.ttl, caps("gpu"))
    thief = await join(h, "thief")
    await victim.claim(1, start=False)
    assert (
        await h.store.steal(
            "thief", thief.session, "victim", ["default"], caps(), limit=1, lease_ttl=h.ttl
        )
        == []
    )
    await h.advance(h.ttl * 1.5)
    with pytest.raises(LeaseLost):
        await h.store.steal(
            "thief", thief.session, "victim", ["default"], caps("gpu"), limit=1, lease_ttl=h.ttl
        )


async def test_steal_takes_only_the_task_types_the_thief_has(harness: Harness) -> None:
    h = harness
    known, unknown = spec("t", priority=1), spec("t_v2", priority=2)
    await h.store.submit([known, unknown])
    victim, thief = await join(h, "victim"), await join(h, "thief")
    await victim.claim(2, start=False)
    steal = h.store.steal
    args = ("thief", thief.session, "victim", ["default"], caps())
    assert await steal(*args, limit=5, lease_ttl=h.ttl, types=[]) == []
    stolen = await steal(*args, limit=5, lease_ttl=h.ttl, types=["t"])
    assert [c.id for c in stolen] == [known.id]
    assert (await h.store.get(unknown.id)).owner == "victim"


async def test_backlog_counts_due_pending_tasks_and_the_oldest_wait(harness: Harness) -> None:
    h = harness
    empty = await h.store.backlog(["default"])
    assert (empty.pending, empty.oldest_age) == (0, None)
    await h.store.submit([spec("t"), spec("t"), spec("t", delay=h.ttl * 100)])
    await h.store.submit([spec("t", queue="other")])
    await h.advance(h.ttl / 2)
    b = await h.store.backlog(["default"])
    assert b.pending == 2
    assert b.oldest_age is not None and b.oldest_age >= h.ttl / 2 - h.tolerance
    assert (await h.store.backlog(["default", "other"])).pending == 3


async def test_heartbeat_metrics_come_back_with_the_expert(harness: Harness) -> None:
    h = harness
    e = await join(h, "e1")
    metrics = {"types": {"t": [3, 1, 0.25]}, "window": 0.02, "active": True, "prefetched": 2}
    await h.store.renew("e1", e.session, h.ttl, Heartbeat(load=1, metrics=metrics))
    (rec,) = [r for r in await h.store.list_experts() if r.info.id == "e1"]
    assert dict(rec.metrics) == metrics
    assert rec.to_json()["metrics"] == metrics


async def test_the_low_lane_takes_the_oldest_tasks_whatever_their_priority(
    harness: Harness,
) -> None:
    h = harness
    old = await h.store.submit([spec("t", i, priority=0) for i in range(3)])
    await h.advance(h.ttl / 10)
    await h.store.submit([spec("t", i, priority=5) for i in range(6)])
    e = await join(h, "e")
    peeked = await h.store.peek(["default"], caps(), 4, low_lane=1)
    got = await h.store.claim(
        "e", e.session, ["default"], caps(), limit=4, lease_ttl=h.ttl, low_lane=1
    )
    assert {c.id for c in got} == {v.id for v in peeked}
    assert sorted(c.priority for c in got) == [0, 5, 5, 5]
    assert old[0].id in {c.id for c in got}  # the oldest of all
    plain = await h.store.claim("e", e.session, ["default"], caps(), limit=2, lease_ttl=h.ttl)
    assert [c.priority for c in plain] == [5, 5]


async def test_the_low_lane_takes_lower_priority_work_behind_a_flood(harness: Harness) -> None:
    # the tasks due the longest are the flood's own: the lane must reach past them
    h = harness
    flood = await h.store.submit([spec("t", i, priority=100) for i in range(20)])
    await h.advance(h.ttl / 10)
    low = await h.store.submit([spec("t", i, priority=0) for i in range(3)])
    e = await join(h, "e")
    peeked = await h.store.peek(["default"], caps(), 5, low_lane=1)
    got = await h.store.claim(
        "e", e.session, ["default"], caps(), limit=5, lease_ttl=h.ttl, low_lane=1
    )
    assert {c.id for c in got} == {v.id for v in peeked}
    assert {c.id for c in got} == {t.id for t in flood[:4]} | {low[0].id}
    named = await h.store.claim(
        "e",
        e.session,
        ["default"],
        caps(),
        limit=5,
        lease_ttl=h.ttl,
        low_lane=1,
        task_ids=[t.id for t in flood + low],
    )
    assert {c.id for c in named} == {t.id for t in flood[4:8]} | {low[1].id}


async def test_the_low_lane_serves_every_level_below_the_top_oldest_first(
    harness: Harness,
) -> None:
    h = harness
    await h.store.submit([spec("t", i, priority=100) for i in range(5)])
    order = []
    for priority in (50, 0, 50, 0):
        await h.advance(h.ttl / 10)
        (sub,) = await h.store.submit([spec("t", priority=priority)])
        order.append(sub.id)
    e = await join(h, "e")
    got = await h.store.claim(
        "e", e.session, ["default"], caps(), limit=4, lease_ttl=h.ttl, low_lane=2
    )
    assert sorted(c.priority for c in got) == [0, 50, 100, 100]
    assert {c.id for c in got} >= set(order[:2])  # the oldest two below the top


async def test_the_low_lane_takes_nothing_out_of_turn_at_one_priority(harness: Harness) -> None:
    # one priority everywhere: the lane has nothing to reach for, and the claim stays first
    # in, first out and full
    h = harness
    ids = []
    for i in range(6):
        (sub,) = await h.store.submit([spec("t", i, priority=5)])
        ids.append(sub.id)
        await h.advance(h.ttl / 20)
    e = await join(h, "e")
    got = await h.store.claim(
        "e", e.session, ["default"], caps(), limit=3, lease_ttl=h.ttl, low_lane=1
    )
    assert {c.id for c in got} == set(ids[:3])
    peeked = await h.store.peek(["default"], caps(), 3, low_lane=1)
    assert [v.id for v in peeked] == ids[3:]


async def test_the_low_lane_skips_what_the_expert_cannot_run(harness: Harness) -> None:
    h = harness
    await h.store.submit([spec("t", i, priority=100) for i in range(4)])
    await h.advance(h.ttl / 10)
    (gpu,) = await h.store.submit([spec("t", priority=0, requirements=["gpu"])])
    await h.advance(h.ttl / 10)
    (plain,) = await h.store.submit([spec("t", priority=0)])
    await h.advance(h.ttl / 10)
    (other,) = await h.store.submit([spec("u", priority=0)])
    e = await join(h, "e")
    got = await h.store.claim(
        "e", e.session, ["default"], caps(), limit=3, lease_ttl=h.ttl, low_lane=1, types=["t"]
    )
    ids = {c.id for c in got}
    assert plain.id in ids and gpu.id not in ids and other.id not in ids
    assert sorted(c.priority for c in got) == [0, 100, 100]


async def _wait(h: Harness, seconds: float) -> None:
    """Let *seconds* pass in steps no expert's session outlives."""
    step = min(h.ttl / 2, 5.0)
    waited = 0.0
    while waited < seconds:
        await h.advance(step)
        waited += step


async def test_waiting_tasks_gain_priority_as_they_age(harness: Harness) -> None:
    h = harness
    (old,) = await h.store.submit([spec("t", priority=0)])
    # after e^3 - 1 ≈ 19.1 s a priority-0 task has aged to 3: above a fresh priority 2 (the
    # first priority other than 0 in the store: the ageing it had skipped catches up)
    await _wait(h, 20.0)
    (fresh,) = await h.store.submit([spec("t", priority=2)])
    await h.store.expire()  # housekeeping applies the ageing
    e = await join(h, "e")
    (first,) = await e.claim(1)
    assert first.id == old.id
    (second,) = await e.claim(1)
    assert second.id == fresh.id


async def test_a_delayed_task_ages_from_its_due_time_not_its_creation(harness: Harness) -> None:
    h = harness
    # due in 30 s, then one of the same priority due in 0 s, submitted 25 s later: at 60 s
    # the first has waited 30 s (aged + 3), the second 35 s (+ 3), so the earlier due goes
    # first. Reckoned from creation, the delayed task (60 s: + 4) jumped ahead of it.
    (delayed,) = await h.store.submit([spec("t", priority=1, delay=30.0)])
    await _wait(h, 25.0)
    (plain,) = await h.store.submit([spec("t", priority=1)])
    await _wait(h, 35.0)
    await h.store.expire()
    e = await join(h, "e")
    assert [(await e.claim_one()).id for _ in range(2)] == [plain.id, delayed.id]


async def test_a_retried_task_ages_again_from_its_new_due_time(harness: Harness) -> None:
    h = harness
    (old,) = await h.store.submit([spec("t", priority=1)])
    await _wait(h, 20.0)  # aged to 1 + 3
    await h.store.expire()
    e = await join(h, "e")
    (c,) = await e.claim(1)
    assert c.id == old.id
    (fresh,) = await h.store.submit([spec("t", priority=3)])
    assert await e.write("fail", old.id, c.fence, retry_delay=0.0) is None
    await h.advance(0.5)
    await h.store.expire()
    # due again from now, the retried task starts again at its base priority, below 3
    assert [(await e.claim_one()).id for _ in range(2)] == [fresh.id, old.id]
