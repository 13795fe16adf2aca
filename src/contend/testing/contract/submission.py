"""The store contract: Submission and dependencies: what goes in, what is refused, what waits.

Times are moved with ``harness.advance``; leases use ``harness.ttl``. Nothing here sleeps to
synchronise: wake-ups are awaited with a deadline.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from contend.domain.task import TaskState
from contend.errors import (
    DependencyError,
    TaskNotFound,
)
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import (
    CANCELLED,
    DEAD,
    FAILED,
    P,
    W,
    join,
    snapshot,
    spec,
    state_of,
)

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
