"""The store contract: Claims: one owner, fence and attempt + 1, order, filters.

Times are moved with ``harness.advance``; leases use ``harness.ttl``. Nothing here sleeps to
synchronise: wake-ups are awaited with a deadline.
"""

from __future__ import annotations

import pytest

from contend.errors import (
    DependencyError,
    FencedOut,
    LeaseLost,
)
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import (
    C,
    P,
    R,
    caps,
    join,
    pass_time,
    snapshot,
    spec,
    state_of,
)

# -- claim -----------------------------------------------------------------------------------


async def test_a_large_refused_submission_writes_nothing(harness: Harness) -> None:
    """Every check runs before the first write, also for a batch a backend writes in parts."""
    s = harness.store
    n = 2 * max(s.promises.atomic_submit or 0, 200) + 1  # several etcd Txns at 128 ops
    specs = [spec() for _ in range(n - 1)] + [spec(depends_on=["no-such-task"])]
    with pytest.raises(DependencyError, match="no-such-task"):
        await s.submit(specs)
    assert await snapshot(s) == []


async def test_a_batch_cut_short_is_completed_by_sending_it_again(harness: Harness) -> None:
    """What a backend that writes large batches in parts promises after a failure between two
    parts: the same specs sent again add what is missing and duplicate nothing."""
    s = harness.store
    specs = [spec("job", n) for n in range(2 * max(s.promises.atomic_submit or 0, 200) + 1)]
    first = await s.submit(specs[: len(specs) // 2])  # as if the rest never made it
    again = await s.submit(specs)
    assert all(sub.created for sub in first)
    assert [sub.created for sub in again] == [False] * len(first) + [True] * (
        len(specs) - len(first)
    )
    assert len(await s.list_tasks(limit=10_000)) == len(specs)


async def test_claim_hands_a_task_to_one_expert(harness: Harness) -> None:
    s = harness.store
    t = spec("a", 1)
    await s.submit([t])
    e1, e2 = await join(harness, "e1"), await join(harness, "e2")
    got = await e1.claim(5)
    assert [c.id for c in got] == [t.id]
    c = got[0]
    assert (c.type, c.args, c.fence, c.attempt, c.checkpoint) == ("a", [1], 1, 1, None)
    assert c.lease_deadline == harness.at(await s.now() + harness.ttl)
    assert await e2.claim(5) == []
    assert await e1.claim(5) == []
    task = await s.get(t.id)
    assert (task.state, task.owner, task.fence, task.attempts) == (R, "e1", 1, 1)
    assert task.lease_deadline == harness.at(c.lease_deadline)


async def test_claim_without_start_leaves_the_task_claimed(harness: Harness) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one(start=False)
    assert await state_of(s, t.id) == C
    assert await e.write("start", t.id, c.fence) is None
    assert await state_of(s, t.id) == R
    assert isinstance(await e.write("start", t.id, c.fence), FencedOut)


async def test_every_claim_adds_one_to_fence_and_attempts(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=5)
    await s.submit([t])
    e1, e2 = await join(harness, "e1"), await join(harness, "e2")
    c1 = await e1.claim_one()
    assert (c1.fence, c1.attempt) == (1, 1)
    await harness.advance(harness.ttl * 2)  # e1 and its lease lapse
    assert await s.expire() == 1
    e2 = await join(harness, "e3")
    c2 = await e2.claim_one()
    assert (c2.fence, c2.attempt) == (2, 2)
    assert await e2.write("fail", t.id, c2.fence, retry_delay=0.0) is None
    c3 = await e2.claim_one()
    assert (c3.fence, c3.attempt) == (3, 3)
    task = await s.get(t.id)
    assert (task.fence, task.attempts, task.owner) == (3, 3, "e3")


async def test_claim_by_a_lapsed_or_unknown_session_raises_lease_lost(harness: Harness) -> None:
    s = harness.store
    await s.submit([spec()])
    e = await join(harness)
    with pytest.raises(LeaseLost):
        await s.claim("e1", "not-the-session", ["default"], e.capabilities, limit=1, lease_ttl=5)
    with pytest.raises(LeaseLost):
        await s.claim("ghost", e.session, ["default"], e.capabilities, limit=1, lease_ttl=5)
    await harness.advance(harness.ttl * 2)
    with pytest.raises(LeaseLost):
        await e.claim()
    assert (await s.list_tasks())[0].state == P


async def test_claim_order_is_priority_then_first_in_first_out(harness: Harness) -> None:
    s = harness.store
    order = []
    for prio in (0, 5, -3, 5, 0, 10, -3):
        t = spec("a", prio, priority=prio)
        await s.submit([t])
        order.append((prio, t.id))
        await harness.advance(harness.ttl * 0.05)
    expected = [tid for _, tid in sorted(order, key=lambda x: -x[0])]  # stable: FIFO in a prio
    e = await join(harness)
    got = [(await e.claim_one()).id for _ in order]
    assert got == expected


async def test_claim_order_is_first_in_first_out_within_one_batch(harness: Harness) -> None:
    s = harness.store
    batch = [spec("a", n) for n in range(30)]
    await s.submit(batch)
    e = await join(harness)
    got = [(await e.claim_one()).args[0] for _ in batch]
    assert got == list(range(30))


async def test_claim_with_a_limit_takes_the_best_tasks(harness: Harness) -> None:
    s = harness.store
    low = [spec("a", priority=1) for _ in range(3)]
    high = [spec("a", priority=9) for _ in range(2)]
    await s.submit(low + high)
    e = await join(harness)
    got = await e.claim(3)
    assert {c.id for c in got} == {high[0].id, high[1].id, low[0].id}


async def test_claim_filters_on_tags_and_resource_amounts(harness: Harness) -> None:
    s = harness.store
    gpu = spec("a", requirements=["gpu"])
    big = spec("a", requirements={"resources": {"mem_gb": 32}})
    both = spec("a", requirements={"tags": ["gpu"], "resources": {"mem_gb": 8}})
    plain = spec("a")
    await s.submit([gpu, big, both, plain])
    small = await join(harness, "small", capabilities=caps("cpu", mem_gb=16))
    assert [c.id for c in await small.claim(10)] == [plain.id]
    peeked = await s.peek(["default"], caps("gpu", mem_gb=8), 10)
    assert {v.id for v in peeked} == {gpu.id, both.id}
    gpu8 = await join(harness, "gpu8", capabilities=caps("gpu", mem_gb=8))
    assert {c.id for c in await gpu8.claim(10)} == {gpu.id, both.id}
    huge = await join(harness, "huge", capabilities=caps(mem_gb=32))
    assert [c.id for c in await huge.claim(10)] == [big.id]


async def test_claim_only_takes_tasks_of_the_expert_queues(harness: Harness) -> None:
    s = harness.store
    a, b = spec("a", queue="qa"), spec("a", queue="qb")
    await s.submit([a, b])
    e = await join(harness)
    assert await e.claim(5) == []
    assert [c.id for c in await e.claim(5, queues=["qb"])] == [b.id]
    assert [c.id for c in await e.claim(5, queues=["qa", "qb"])] == [a.id]


async def test_claim_only_takes_the_task_types_the_expert_has(harness: Harness) -> None:
    """A rolling deploy: an expert whose app lacks a task type must leave its tasks to the
    experts that have it, not claim them and fail them for good."""
    s = harness.store
    new = spec("resize_v2", priority=5)  # the best task, of a type old experts do not know
    old, other = spec("resize"), spec("encode")
    await s.submit([new, old, other])
    peeked = await s.peek(["default"], caps(), 10, types=["resize", "encode"])
    assert [v.id for v in peeked] == [old.id, other.id]
    assert await s.peek(["default"], caps(), 10, types=[]) == []
    e = await join(harness, "old")
    assert await e.claim(10, types=["thumbnail"]) == []
    assert await e.claim(10, types=[]) == []
    assert await e.claim(10, task_ids=[new.id], types=["resize", "encode"]) == []
    got = await e.claim(10, types=["resize"])
    assert [c.id for c in got] == [old.id]
    assert await state_of(s, new.id) == P
    n = await join(harness, "new")
    assert [c.id for c in await n.claim(1, types=["resize_v2", "resize", "encode"])] == [new.id]
    assert [c.id for c in await n.claim(5)] == [other.id]  # None: any type


async def test_delayed_task_is_not_claimable_before_it_is_due(harness: Harness) -> None:
    s = harness.store
    later = harness.ttl * 3
    t = spec(delay=later)
    await s.submit([t])
    due = (await s.get(t.id)).run_at
    assert due == harness.at(await s.now() + later)
    assert await s.next_due(["default"]) == harness.at(due)
    e = await join(harness)
    assert await e.claim() == []
    assert await s.peek(["default"], e.capabilities, 5) == []
    await pass_time(harness, later - harness.ttl * 0.1, e)
    assert await e.claim() == []
    await pass_time(harness, harness.ttl * 0.2, e)
    assert (await e.claim_one()).id == t.id


async def test_claim_with_task_ids_takes_only_those_that_are_claimable(harness: Harness) -> None:
    s = harness.store
    a, b, other_q, gpu, later = (
        spec(),
        spec(),
        spec(queue="other"),
        spec(requirements=["gpu"]),
        spec(delay=harness.ttl * 6),
    )
    await s.submit([a, b, other_q, gpu, later])
    e = await join(harness)
    ids = [b.id, other_q.id, gpu.id, later.id, "missing"]
    got = await e.claim(10, task_ids=ids)
    assert [c.id for c in got] == [b.id]
    assert await e.claim(10, task_ids=[b.id]) == []
    assert await state_of(s, a.id) == P
    assert await e.claim(10, task_ids=[]) == []
    assert [c.id for c in await e.claim(10, task_ids=[a.id])] == [a.id]
