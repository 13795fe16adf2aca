"""The store contract: Management, inspection, wake-ups and bad arguments.

Times are moved with ``harness.advance``; leases use ``harness.ttl``. Nothing here sleeps to
synchronise: wake-ups are awaited with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from contend.errors import (
    ConfigError,
    InvalidTransition,
    LeaseLost,
    TaskNotFound,
)
from contend.store.port import Completion, ExpertInfo, Failure, Heartbeat, Store
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import (
    CANCELLED,
    DEAD,
    FAILED,
    Expert,
    P,
    R,
    join,
    snapshot,
    spec,
    state_of,
)

# -- management: cancel and retry --------------------------------------------------------------


async def test_cancel_applies_to_unfinished_tasks_only(harness: Harness) -> None:
    s = harness.store
    pending, waiting, claimed, done = spec(), spec(), spec(), spec()
    await s.submit([claimed, done])
    e = await join(harness)
    await e.claim_one(start=False, task_ids=[claimed.id])
    cd = await e.claim_one(start=False, task_ids=[done.id])
    assert await e.write("complete", cd.id, cd.fence) is None
    await s.submit([pending, replace(waiting, depends_on=(claimed.id,))])
    for tid in (pending.id, waiting.id, claimed.id):
        assert (await s.cancel(tid)).state == CANCELLED
        assert await state_of(s, tid) == CANCELLED
    for tid in (done.id, pending.id):
        before = await snapshot(s)
        with pytest.raises(InvalidTransition) as info:
            await s.cancel(tid)
        assert info.value.operation == "cancel" and tid in str(info.value)
        assert await snapshot(s) == before
    with pytest.raises(TaskNotFound):
        await s.cancel("missing")


async def test_retry_sends_a_finished_task_back_to_pending(harness: Harness) -> None:
    s = harness.store
    failed, dead, cancelled = spec(max_attempts=2), spec(), spec()
    await s.submit([failed, dead, cancelled])
    e = await join(harness)
    claims = {c.id: c for c in await e.claim(3)}
    await e.write("fail", failed.id, claims[failed.id].fence, final_state=FAILED)
    await e.write("fail", dead.id, claims[dead.id].fence, final_state=DEAD)
    await s.cancel(cancelled.id)
    await harness.advance(harness.ttl * 0.5)
    for tid in (failed.id, dead.id, cancelled.id):
        task = await s.retry(tid)
        assert (task.state, task.attempts, task.owner) == (P, 0, None)
        assert task.run_at == harness.at(await s.now())
        assert task.fence >= 1
    got = {c.id: c for c in await e.claim(5)}
    assert set(got) == {failed.id, dead.id, cancelled.id}
    assert all(c.attempt == 1 for c in got.values())
    assert got[failed.id].fence == claims[failed.id].fence + 1  # fences only grow


async def test_retry_of_an_unfinished_task_is_an_invalid_transition(harness: Harness) -> None:
    s = harness.store
    pending, running, done = spec(), spec(), spec()
    await s.submit([running, done])
    e = await join(harness)
    await e.claim_one(task_ids=[running.id])
    cd = await e.claim_one(task_ids=[done.id])
    assert await e.write("complete", cd.id, cd.fence) is None
    await s.submit([pending])
    for tid in (pending.id, running.id, done.id):
        before = await snapshot(s)
        with pytest.raises(InvalidTransition) as info:
            await s.retry(tid)
        assert info.value.operation == "retry"
        assert "cannot retry" in str(info.value) and tid in str(info.value)
        assert await snapshot(s) == before
    with pytest.raises(TaskNotFound):
        await s.retry("missing")


# -- inspection ------------------------------------------------------------------------------


async def test_stats_counts_tasks_by_queue_and_state(harness: Harness) -> None:
    s = harness.store
    a1, a2, a3, b1 = spec(), spec(), spec(), spec(queue="b")
    dep = spec(depends_on=[a1.id])
    await s.submit([a1, a2, a3, b1, dep])
    e = await join(harness)
    c1 = await e.claim_one(task_ids=[a1.id])
    await e.claim_one(task_ids=[a2.id])
    assert await e.write("complete", a1.id, c1.fence) is None
    await harness.advance(harness.ttl * 0.3)
    stats = await s.stats()
    assert stats.counts == {
        "default": {"succeeded": 1, "running": 1, "pending": 2},
        "b": {"pending": 1},
    }
    assert stats.done_last_minute == 1
    assert stats.oldest_pending_age == harness.at(harness.ttl * 0.3)
    assert [x.info.id for x in stats.experts] == ["e1"]
    assert stats.now == harness.at(await s.now())


async def test_stats_splits_the_last_minute_by_queue(harness: Harness) -> None:
    """``done_by_queue`` is ``done_last_minute`` queue by queue (a pipeline stage's rate)."""
    s = harness.store
    a1, a2, b1, b2 = spec(queue="a"), spec(queue="a"), spec(queue="b"), spec(queue="b")
    await s.submit([a1, a2, b1, b2, spec(queue="c")])
    e = await join(harness)
    for t in (a1, a2, b1):
        c = await e.claim_one(queues=[t.queue], task_ids=[t.id])
        assert await e.write("complete", t.id, c.fence) is None
    stats = await s.stats()
    assert stats.done_by_queue == {"a": 2, "b": 1}
    assert stats.done_last_minute == 3
    assert stats.to_json()["done_last_minute_by_queue"] == {"a": 2, "b": 1}
    await harness.advance(45)
    e2 = await join(harness, "e2")
    c = await e2.claim_one(queues=["b"], task_ids=[b2.id])
    assert await e2.write("complete", b2.id, c.fence) is None
    assert (await s.stats()).done_by_queue == {"a": 2, "b": 2}
    await harness.advance(30)
    stats = await s.stats()
    assert stats.done_by_queue == {"b": 1}
    assert stats.done_last_minute == 1


async def test_stats_done_last_minute_forgets_older_commits(harness: Harness) -> None:
    s = harness.store
    a, b = spec(), spec()
    await s.submit([a, b])
    e = await join(harness)
    ca = await e.claim_one(task_ids=[a.id])
    assert await e.write("complete", a.id, ca.fence) is None
    await harness.advance(45)
    e2 = await join(harness, "e2")
    cb = await e2.claim_one(task_ids=[b.id])
    assert await e2.write("complete", b.id, cb.fence) is None
    assert (await s.stats()).done_last_minute == 2
    await harness.advance(30)
    assert (await s.stats()).done_last_minute == 1
    await harness.advance(31)
    assert (await s.stats()).done_last_minute == 0


async def test_list_tasks_filters_by_state_and_queue(harness: Harness) -> None:
    s = harness.store
    a, b, c = spec(), spec(queue="x"), spec(queue="x")
    await s.submit([a, b, c])
    e = await join(harness)
    await e.claim(1, queues=["x"], task_ids=[b.id])
    assert {t.id for t in await s.list_tasks(queue="x")} == {b.id, c.id}
    assert {t.id for t in await s.list_tasks(state=P)} == {a.id, c.id}
    assert [t.id for t in await s.list_tasks(state=R, queue="x")] == [b.id]
    assert len(await s.list_tasks(limit=2)) == 2


async def test_list_tasks_filters_by_type_and_lists_newest_first(harness: Harness) -> None:
    """What a dashboard and ``contend tasks list --newest --type`` ask: the newest tasks of a
    type, found by the store rather than picked out of the oldest few thousand."""
    s = harness.store
    specs = [spec("a"), spec("b"), spec("a"), spec("b", queue="x"), spec("a")]
    await s.submit(specs)
    ids = sorted(t.id for t in specs)
    a_ids = sorted(t.id for t in specs if t.type == "a")
    assert [t.id for t in await s.list_tasks()] == ids
    assert [t.id for t in await s.list_tasks(newest=True)] == ids[::-1]
    assert [t.id for t in await s.list_tasks(newest=True, limit=2)] == ids[::-1][:2]
    assert [t.id for t in await s.list_tasks(type="a")] == a_ids
    assert [t.id for t in await s.list_tasks(type="a", newest=True, limit=2)] == a_ids[::-1][:2]
    assert [t.type for t in await s.list_tasks(type="b", queue="x")] == ["b"]
    assert await s.list_tasks(type="none") == []


# -- concurrency and wake-ups ----------------------------------------------------------------


async def test_concurrent_claimers_never_get_the_same_task(harness: Harness) -> None:
    s = harness.store
    tasks = [spec("a", n) for n in range(60)]
    await s.submit(tasks)
    experts = [await join(harness, f"e{n}", store=await harness.new_store()) for n in range(6)]

    async def drain(e: Expert, limit: int) -> list[tuple[str, int]]:
        mine: list[tuple[str, int]] = []
        while True:
            got = await e.claim(limit)
            if not got:
                return mine
            mine.extend((c.id, c.fence) for c in got)
            await asyncio.sleep(0)

    results = await asyncio.gather(*(drain(e, 1 + n % 3) for n, e in enumerate(experts)))
    claimed = [tid for r in results for tid, _ in r]
    assert sorted(claimed) == sorted(t.id for t in tasks)
    assert len(set(claimed)) == len(claimed)
    owners = {tid: experts[n].name for n, r in enumerate(results) for tid, _ in r}
    for t in await s.list_tasks(limit=1000):
        assert (t.state, t.owner, t.fence) == (R, owners[t.id], 1)


async def test_concurrent_owner_writes_land_exactly_once(harness: Harness) -> None:
    """Two instances of the same expert race to complete one task: one commit lands."""
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    stores = [await harness.new_store() for _ in range(4)]
    outs = await asyncio.gather(
        *(
            st.complete("e1", [Completion(t.id, c.fence, json.dumps(n))])
            for n, st in enumerate(stores)
        ),
        *(st.fail("e1", [Failure(t.id, c.fence, "{}", 0.0)]) for st in stores),
    )
    landed = [o[0] for o in outs if o[0] is None]
    assert len(landed) == 1


async def _wakes(waiter: Store, act: Awaitable[object], *, within: float = 5.0) -> float:
    """How long after *act* began both of *waiter*'s waits returned: for any change and for
    work (every act here makes work)."""
    await waiter.wait_for_change(0)  # take in earlier changes
    await waiter.wait_for_work(0)
    started = time.monotonic()
    waiting = [asyncio.create_task(w(60)) for w in (waiter.wait_for_change, waiter.wait_for_work)]
    await asyncio.sleep(0)
    await act
    await asyncio.wait_for(asyncio.gather(*waiting), within)
    return time.monotonic() - started


async def test_waits_return_soon_after_another_instance_submits(harness: Harness) -> None:
    waiter, other = await harness.new_store(), await harness.new_store()
    took = await _wakes(waiter, other.submit([spec()]))
    assert took < 5


async def test_waits_return_soon_after_a_failure_is_retried(harness: Harness) -> None:
    s = harness.store
    a = spec(max_attempts=2)
    await s.submit([a])
    e = await join(harness)
    c = await e.claim_one()
    took = await _wakes(s, s.fail(e.name, [Failure(a.id, c.fence, "{}", 0.0)]))
    assert took < 5
    assert await state_of(s, a.id) == P


async def test_waits_return_soon_after_a_commit_frees_a_dependent(harness: Harness) -> None:
    s = harness.store
    a = spec()
    b = spec(depends_on=[a.id])
    await s.submit([a, b])
    e = await join(harness)
    c = await e.claim_one()
    took = await _wakes(s, e.write("complete", a.id, c.fence))
    assert took < 5
    assert await state_of(s, b.id) == P


async def test_wait_for_change_without_a_change_waits_for_its_timeout(harness: Harness) -> None:
    s = harness.store
    await s.wait_for_change(0)
    started = time.monotonic()
    await s.wait_for_change(0.2)
    assert time.monotonic() - started >= 0.15


# -- bad arguments -----------------------------------------------------------------------------


async def test_a_limit_of_zero_returns_nothing(harness: Harness) -> None:
    s = harness.store
    await s.submit([spec(), spec()])
    e = await join(harness)
    assert await s.list_tasks(limit=0) == []
    assert await s.peek(["default"], e.capabilities, 0) == []
    assert await e.claim(0) == []
    assert all(t.state == P for t in await s.list_tasks())


async def test_claim_checks_the_session_whatever_it_is_asked_for(harness: Harness) -> None:
    s = harness.store
    await s.submit([spec()])
    e = await join(harness)
    await harness.advance(harness.ttl * 2)
    with pytest.raises(LeaseLost):
        await e.claim(0)
    with pytest.raises(LeaseLost):
        await e.claim(1, queues=[])
    with pytest.raises(LeaseLost):
        await e.claim(1, task_ids=[])


@pytest.mark.parametrize(
    "call",
    [
        "claim-negative-limit",
        "claim-zero-ttl",
        "claim-infinite-ttl",
        "renew-negative-ttl",
        "register-zero-ttl",
        "list-negative-limit",
        "peek-negative-limit",
        "fail-nan-delay",
        "fail-infinite-delay",
        "fail-negative-delay",
    ],
)
async def test_bad_arguments_are_a_config_error_and_change_nothing(
    harness: Harness, call: str
) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    await s.submit([spec()])
    before = await snapshot(s)
    experts_before = [x.to_json() for x in await s.list_experts()]
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "claim-negative-limit": lambda: e.claim(-1),
        "claim-zero-ttl": lambda: s.claim(
            "e1", e.session, ["default"], e.capabilities, limit=1, lease_ttl=0
        ),
        "claim-infinite-ttl": lambda: s.claim(
            "e1", e.session, ["default"], e.capabilities, limit=1, lease_ttl=float("inf")
        ),
        "renew-negative-ttl": lambda: s.renew("e1", e.session, -1, Heartbeat()),
        "register-zero-ttl": lambda: s.register_expert(ExpertInfo(id="e2"), 0),
        "list-negative-limit": lambda: s.list_tasks(limit=-1),
        "peek-negative-limit": lambda: s.peek(["default"], e.capabilities, -1),
        "fail-nan-delay": lambda: s.fail("e1", [Failure(t.id, c.fence, "{}", float("nan"))]),
        "fail-infinite-delay": lambda: s.fail("e1", [Failure(t.id, c.fence, "{}", float("inf"))]),
        "fail-negative-delay": lambda: s.fail("e1", [Failure(t.id, c.fence, "{}", -5.0)]),
    }
    with pytest.raises(ConfigError):
        await calls[call]()
    assert await snapshot(s) == before
    assert [x.to_json() for x in await s.list_experts()] == experts_before


async def test_claim_with_task_ids_and_a_limit_takes_the_best_of_them(harness: Harness) -> None:
    s = harness.store
    low, mid, high = spec(priority=1), spec(priority=5), spec(priority=9)
    await s.submit([low, mid, high])
    e = await join(harness)
    got = await e.claim(2, task_ids=[low.id, mid.id, high.id])
    assert {c.id for c in got} == {high.id, mid.id}
