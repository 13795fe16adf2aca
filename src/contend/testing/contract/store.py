"""The store contract: every backend registered in ``backends.py`` must pass all of it.

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

from contend.domain.retry import RetryPolicy
from contend.domain.task import Capabilities, TaskState
from contend.errors import (
    ConfigError,
    DependencyError,
    ExpertConflict,
    FencedOut,
    InvalidTransition,
    LeaseLost,
    TaskNotFound,
)
from contend.store.port import Completion, ExpertInfo, Failure, Heartbeat, Store
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import OWNER_WRITES, Expert, caps, snapshot, spec

P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING
OK, FAILED, DEAD, CANCELLED = (
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.DEAD,
    TaskState.CANCELLED,
)


async def join(
    h: Harness,
    name: str = "e1",
    store: Store | None = None,
    capabilities: Capabilities | None = None,
) -> Expert:
    return await Expert.join(store or h.store, name, h.ttl, capabilities)


async def state_of(store: Store, task_id: str) -> TaskState:
    return (await store.get(task_id)).state


async def pass_time(h: Harness, seconds: float, *experts: Expert) -> None:
    """Move the clock by *seconds* in steps short enough for *experts* to keep their leases."""
    step = h.ttl / 2
    while seconds > 0:
        await h.advance(min(step, seconds))
        seconds -= step
        for e in experts:
            await e.renew()


# -- submission ------------------------------------------------------------------------------


async def test_submit_and_get_round_trip_every_field(harness: Harness) -> None:
    s = harness.store
    args = [1, -2.5, "ünïcødé ✓", None, True, [1, [2, {"a": None}]], {"k": [1, 2]}]
    kwargs = {"nested": {"list": [1, 2, 3], "empty": {}, "s": 'x\ny"z'}, "n": 10**15}
    t = spec(
        "mail.send",
        *args,
        kwargs=kwargs,
        queue="q1",
        priority=7,
        key="k-1",
        requirements={"tags": ["gpu"], "resources": {"mem_gb": 4}},
        max_attempts=5,
        timeout=12.5,
    )
    before = await s.now()
    (sub,) = await s.submit([t])
    assert sub.id == t.id and sub.created

    got = await s.get(t.id)
    assert got.id == t.id
    assert got.type == "mail.send"
    assert got.args == args
    assert got.kwargs == kwargs
    assert got.queue == "q1"
    assert got.priority == 7
    assert got.key == "k-1"
    assert got.requirements.tags == frozenset({"gpu"})
    assert dict(got.requirements.resources) == {"mem_gb": 4.0}
    assert got.max_attempts == 5
    assert got.timeout == 12.5
    assert got.state == P
    assert (got.attempts, got.fence, got.owner, got.lease_deadline) == (0, 0, None, None)
    assert (got.result, got.error, got.checkpoint) == (None, None, None)
    assert got.created_at == harness.at(before)
    assert got.run_at == harness.at(before)
    assert got.depends_on == ()
    assert json.loads(json.dumps(got.to_json())) == got.to_json()


async def test_get_unknown_task_raises_task_not_found(harness: Harness) -> None:
    with pytest.raises(TaskNotFound, match="nope"):
        await harness.store.get("nope")


async def test_idempotency_key_returns_the_existing_task(harness: Harness) -> None:
    s = harness.store
    first = spec("a", 1, key="order-42")
    (sub1,) = await s.submit([first])
    again = spec("a", 2, key="order-42")
    (sub2,) = await s.submit([again])
    assert sub1.created and not sub2.created
    assert sub2.id == first.id
    assert (await s.get(first.id)).args == [1]
    with pytest.raises(TaskNotFound):
        await s.get(again.id)
    assert len(await s.list_tasks()) == 1


async def test_idempotency_key_within_one_batch(harness: Harness) -> None:
    s = harness.store
    a, b, c = spec("a", key="same"), spec("a", key="same"), spec("a", key="other")
    subs = await s.submit([a, b, c])
    assert [x.id for x in subs] == [a.id, a.id, c.id]
    assert [x.created for x in subs] == [True, False, True]
    assert {t.id for t in await s.list_tasks()} == {a.id, c.id}


async def test_resubmitting_the_same_spec_never_overwrites_the_task(harness: Harness) -> None:
    """A client that lost the reply to ``submit`` may send the same spec again (same id):
    the store recognises it and the task it already holds is left as it is."""
    s = harness.store
    t = spec("a")
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    assert await e.write("complete", t.id, c.fence) is None
    before = await snapshot(s)
    (sub,) = await s.submit([t])
    assert sub.id == t.id and not sub.created
    assert await snapshot(s) == before


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


# -- fencing: every owner write ----------------------------------------------------------------


@pytest.mark.parametrize("op", OWNER_WRITES)
async def test_owner_write_with_the_current_fence_lands(harness: Harness, op: str) -> None:
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one(start=op != "start" and op != "checkpoint")
    if op == "checkpoint":
        assert await e.write("start", t.id, c.fence) is None
    assert await e.write(op, t.id, c.fence, state={"done": 3}) is None
    task = await s.get(t.id)
    expected = {
        "start": R,
        "checkpoint": R,
        "complete": OK,
        "fail": DEAD,
        "release": P,
    }[op]
    assert task.state == expected
    if op == "checkpoint":
        assert task.checkpoint == {"done": 3}
    if op == "complete":
        assert task.result == "ok"
    if op == "fail":
        assert task.error == {"type": "Boom", "message": "boom"}


async def _stale_fence(h: Harness, t_id: str) -> tuple[Expert, int]:
    """e1 claimed the task, released it, and claimed it again: it writes with the old fence."""
    e = await join(h)
    old = await e.claim_one(start=False)
    assert await e.write("release", t_id, old.fence) is None
    new = await e.claim_one(start=False)
    assert new.fence == old.fence + 1
    return e, old.fence


async def _wrong_owner(h: Harness, t_id: str) -> tuple[Expert, int]:
    e1 = await join(h, "e1")
    c = await e1.claim_one(start=False)
    e2 = await join(h, "e2")
    return e2, c.fence


async def _lapsed_lease(h: Harness, t_id: str) -> tuple[Expert, int]:
    e = await join(h)
    c = await e.claim_one(start=False)
    await h.advance(h.ttl * 2)  # nobody ran expire: the task is still 'claimed', lease lapsed
    return e, c.fence


async def _after_reclaim(h: Harness, t_id: str) -> tuple[Expert, int]:
    """e1's lease lapsed, the task expired and e2 owns it now: e1 comes back with its fence."""
    e1 = await join(h, "e1")
    c = await e1.claim_one(start=False)
    await h.advance(h.ttl * 2)
    assert await h.store.expire() == 1
    e2 = await join(h, "e2")
    await e2.claim_one(start=False)
    return e1, c.fence


async def _lapsed_session(h: Harness, t_id: str) -> tuple[Expert, int]:
    """The expert's own lease lapsed, though the task's deadline (set at claim) is still ahead:
    an expert that cannot renew must commit nothing."""
    e = await join(h)
    await h.advance(h.ttl * 0.5)
    c = await e.claim_one(start=False)
    await h.advance(h.ttl * 0.6)
    with pytest.raises(LeaseLost):
        await e.renew()
    return e, c.fence


async def _new_session(h: Harness, t_id: str) -> tuple[Expert, int]:
    """The expert's lease lapsed and the same expert id came back with a new session: the old
    session's claim does not carry over to it."""
    old, fence = await _lapsed_session(h, t_id)
    await join(h, old.name)
    return old, fence


STALE = {
    "stale-fence": _stale_fence,
    "wrong-owner": _wrong_owner,
    "lapsed-lease": _lapsed_lease,
    "after-reclaim": _after_reclaim,
    "lapsed-session": _lapsed_session,
    "new-session": _new_session,
}


@pytest.mark.parametrize("how", list(STALE))
@pytest.mark.parametrize("op", OWNER_WRITES)
async def test_fenced_out_write_is_refused_and_changes_nothing(
    harness: Harness, op: str, how: str
) -> None:
    s = harness.store
    t = spec(max_attempts=5)
    await s.submit([t])
    writer, fence = await STALE[how](harness, t.id)
    before = await snapshot(s)
    refused = await writer.write(op, t.id, fence, retry_delay=0.0, state={"evil": True})
    assert isinstance(refused, FencedOut)
    assert refused.task_id == t.id and refused.fence == fence
    assert t.id in str(refused)
    assert await snapshot(s) == before


async def test_owner_write_to_an_unknown_task_is_fenced_out(harness: Harness) -> None:
    e = await join(harness)
    for op in OWNER_WRITES:
        assert isinstance(await e.write(op, "missing", 1), FencedOut)


async def test_batched_owner_writes_report_each_item(harness: Harness) -> None:
    s = harness.store
    a, b = spec(), spec()
    await s.submit([a, b])
    e = await join(harness)
    ca, cb = await e.claim(2)
    out = await s.complete(
        "e1",
        [Completion(ca.id, ca.fence, "1"), Completion(cb.id, cb.fence + 7, "2")],
    )
    assert out[0] is None and isinstance(out[1], FencedOut)
    assert await state_of(s, ca.id) == OK
    assert await state_of(s, cb.id) == R


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


# -- fail and release ------------------------------------------------------------------------


async def test_fail_with_a_retry_delay_makes_the_task_pending_later(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    later = harness.ttl * 2
    assert await e.write("fail", t.id, c.fence, retry_delay=later) is None
    task = await s.get(t.id)
    assert (task.state, task.owner, task.attempts) == (P, None, 1)
    assert task.run_at == harness.at(await s.now() + later)
    assert task.error == {"type": "Boom", "message": "boom"}
    assert await e.claim() == []
    await pass_time(harness, later - harness.ttl * 0.1, e)
    assert await e.claim() == []
    await pass_time(harness, harness.ttl * 0.2, e)
    assert (await e.claim_one()).attempt == 2


@pytest.mark.parametrize("final", [FAILED, DEAD])
async def test_fail_without_retry_goes_to_the_final_state(
    harness: Harness, final: TaskState
) -> None:
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    assert await e.write("fail", t.id, c.fence, retry_delay=None, final_state=final) is None
    task = await s.get(t.id)
    assert (task.state, task.owner, task.lease_deadline) == (final, None, None)
    assert await e.claim() == []


async def test_a_failure_on_the_last_attempt_is_dead(harness: Harness) -> None:
    """The retry policy decides once, from the attempt the claim reported; the store applies."""
    s = harness.store
    t = spec(max_attempts=1)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    decision = RetryPolicy(backoff=0).decide(c.attempt, None, max_attempts=c.max_attempts)
    delay = decision.delay if decision.retry else None
    final = TaskState(decision.final_state)
    assert await e.write("fail", t.id, c.fence, retry_delay=delay, final_state=final) is None
    assert await state_of(s, t.id) == DEAD


async def test_release_gives_the_task_back_without_counting_the_attempt(
    harness: Harness,
) -> None:
    s = harness.store
    t = spec(max_attempts=1)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    assert await e.write("checkpoint", t.id, c.fence, state={"kept": 1}) is None
    assert await e.write("release", t.id, c.fence) is None
    task = await s.get(t.id)
    assert (task.state, task.owner, task.attempts, task.fence) == (P, None, 0, 1)
    assert task.checkpoint == {"kept": 1}
    assert await e.renew() == {}
    again = await (await join(harness, "e2")).claim_one()
    assert (again.attempt, again.fence, again.checkpoint) == (1, 2, {"kept": 1})


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


# -- dependencies ----------------------------------------------------------------------------


async def test_a_dependent_waits_until_its_dependencies_succeed(harness: Harness) -> None:
    s = harness.store
    a, b = spec("a"), spec("b")
    c = spec("c", depends_on=[a.id, b.id])
    await s.submit([a, b, c])
    assert await state_of(s, c.id) == W
    assert (await s.get(c.id)).depends_on == (a.id, b.id)
    e = await join(harness)
    got = {x.id: x for x in await e.claim(5)}
    assert set(got) == {a.id, b.id}
    assert await e.write("complete", a.id, got[a.id].fence) is None
    assert await state_of(s, c.id) == W
    assert await e.claim() == []
    assert await e.write("complete", b.id, got[b.id].fence) is None
    assert await state_of(s, c.id) == P
    assert (await e.claim_one()).id == c.id


async def test_a_dependency_already_succeeded_does_not_hold_the_task(harness: Harness) -> None:
    s = harness.store
    a = spec("a")
    await s.submit([a])
    e = await join(harness)
    ca = await e.claim_one()
    await e.write("complete", a.id, ca.fence)
    b = spec("b", depends_on=[a.id])
    await s.submit([b])
    assert await state_of(s, b.id) == P


async def test_an_unknown_dependency_is_refused_and_nothing_is_stored(harness: Harness) -> None:
    s = harness.store
    await s.submit([spec("existing")])
    before = await snapshot(s)
    good, bad = spec("good"), spec("bad", depends_on=["no-such-task"])
    with pytest.raises(DependencyError, match="no-such-task"):
        await s.submit([good, bad])
    assert await snapshot(s) == before
    assert sum(sum(q.values()) for q in (await s.stats()).counts.values()) == 1


async def test_a_dependency_cycle_is_refused_and_nothing_is_stored(harness: Harness) -> None:
    s = harness.store
    a, b, c, free = spec("a"), spec("b"), spec("c"), spec("free")
    a = replace(a, depends_on=(c.id,))
    b = replace(b, depends_on=(a.id,))
    c = replace(c, depends_on=(b.id,))
    with pytest.raises(DependencyError, match="cycle"):
        await s.submit([free, a, b, c])
    assert await snapshot(s) == []
    selfish = spec("self")
    with pytest.raises(DependencyError):
        await s.submit([replace(selfish, depends_on=(selfish.id,))])
    assert await snapshot(s) == []


@pytest.mark.parametrize("final", [FAILED, DEAD, CANCELLED])
async def test_a_dependency_that_did_not_succeed_makes_dependents_dead(
    harness: Harness, final: TaskState
) -> None:
    s = harness.store
    a = spec("a")
    b = spec("b", depends_on=[a.id])
    c = spec("c", depends_on=[b.id])
    other = spec("other")
    d = spec("d", depends_on=[other.id, a.id])
    await s.submit([a, b, c, other, d])
    e = await join(harness)
    ca = await e.claim_one(task_ids=[a.id])
    if final == CANCELLED:
        await s.cancel(a.id)
    else:
        assert await e.write("fail", a.id, ca.fence, final_state=final) is None
    for tid in (b.id, c.id, d.id):
        task = await s.get(tid)
        assert task.state == DEAD, tid
        assert task.error is not None
    assert await state_of(s, other.id) == P
    late = spec("late", depends_on=[a.id])
    await s.submit([late])
    assert await state_of(s, late.id) == DEAD


@pytest.mark.parametrize("order", ["dependency-first", "dependent-first"])
async def test_a_dependency_born_dead_in_the_same_batch_makes_its_dependents_dead(
    harness: Harness, order: str
) -> None:
    s = harness.store
    f = spec("f")
    await s.submit([f])
    e = await join(harness)
    cf = await e.claim_one()
    await e.write("fail", f.id, cf.fence, final_state=FAILED)
    a = spec("a", depends_on=[f.id])  # dead at birth: f failed
    b = spec("b", depends_on=[a.id])
    await s.submit([a, b] if order == "dependency-first" else [b, a])
    assert await state_of(s, a.id) == DEAD
    assert await state_of(s, b.id) == DEAD


async def test_expiry_on_the_last_attempt_makes_dependents_dead(harness: Harness) -> None:
    s = harness.store
    a = spec("a", max_attempts=1)
    b = spec("b", depends_on=[a.id])
    await s.submit([a, b])
    e = await join(harness)
    await e.claim_one()
    await harness.advance(harness.ttl * 2)
    assert await s.expire() == 1
    assert await state_of(s, b.id) == DEAD


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
    await waiter.wait_for_change(0)  # take in earlier changes
    started = time.monotonic()
    waiting = asyncio.create_task(waiter.wait_for_change(60))
    await asyncio.sleep(0)
    await act
    await asyncio.wait_for(waiting, within)
    return time.monotonic() - started


async def test_wait_for_change_returns_soon_after_another_instance_submits(
    harness: Harness,
) -> None:
    waiter, other = await harness.new_store(), await harness.new_store()
    took = await _wakes(waiter, other.submit([spec()]))
    assert took < 5


async def test_wait_for_change_returns_soon_after_a_commit_frees_a_dependent(
    harness: Harness,
) -> None:
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
