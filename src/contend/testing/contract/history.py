"""The history every transition writes, and why each refused write was refused, on every backend.

The rules live in ``contend.domain.transitions``; these tests check that every backend records
what the rulebook decided, line for line: the event, the fence, the actor and the detail.
"""

from __future__ import annotations

from typing import Any

import pytest

from contend.domain.task import TaskState
from contend.domain.transitions import Event, Refusal
from contend.errors import FencedOut
from contend.store.port import Store
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import Expert, caps, spec

Line = tuple[str, int, str | None, str | None]


async def join(h: Harness, name: str = "e1") -> Expert:
    return await Expert.join(h.store, name, h.ttl)


async def lines(store: Store, task_id: str) -> list[Line]:
    """(event, fence, expert, detail) of every line of the task's history."""
    history = (await store.get(task_id, history=True)).history
    for line in history:
        assert line.event in set(Event), f"{line.event!r} is not in the event vocabulary"
    return [(h.event, h.fence, h.expert, h.detail) for h in history]


async def error_of(store: Store, task_id: str) -> Any:
    return (await store.get(task_id)).error


# -- the owner's transitions -----------------------------------------------------------------


async def test_claim_start_and_complete(harness: Harness) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one(start=False)
    assert await e.write("start", t.id, c.fence) is None
    assert await e.write("complete", t.id, c.fence) is None
    assert await lines(s, t.id) == [
        ("claimed", 1, "e1", None),
        ("started", 1, "e1", None),
        ("succeeded", 1, "e1", None),
    ]


async def test_a_failure_with_a_retry_delay(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    assert await e.write("fail", t.id, c.fence, retry_delay=2.5) is None
    assert await lines(s, t.id) == [("claimed", 1, "e1", None), ("retry", 1, "e1", "in 2.500s")]


@pytest.mark.parametrize("final", ["failed", "dead"])
async def test_a_final_failure(harness: Harness, final: str) -> None:
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    out = await e.write("fail", t.id, c.fence, retry_delay=None, final_state=TaskState(final))
    assert out is None
    assert await lines(s, t.id) == [("claimed", 1, "e1", None), (final, 1, "e1", None)]


async def test_a_release(harness: Harness) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    assert await e.write("release", t.id, c.fence) is None
    assert await lines(s, t.id) == [("claimed", 1, "e1", None), ("released", 1, "e1", None)]
    assert (await s.get(t.id)).attempts == 0


async def test_a_steal(harness: Harness) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    victim, thief = await join(harness, "victim"), await join(harness, "thief")
    await victim.claim_one(start=False)
    (got,) = await s.steal(
        "thief", thief.session, "victim", ["default"], caps(), limit=1, lease_ttl=harness.ttl
    )
    assert (got.id, got.fence, got.attempt) == (t.id, 2, 1)
    assert await lines(s, t.id) == [
        ("claimed", 1, "victim", None),
        ("stolen", 2, "thief", "from victim"),
    ]


# -- expiry ----------------------------------------------------------------------------------


async def test_an_expiry_with_attempts_left(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=2)
    await s.submit([t])
    e = await join(harness)
    await e.claim_one()
    await harness.advance(harness.ttl * 2)
    assert await s.expire() == 1
    assert await lines(s, t.id) == [("claimed", 1, "e1", None), ("expired", 1, "e1", None)]
    assert (await s.get(t.id)).state == "pending"


async def test_an_expiry_on_the_last_attempt(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=1)
    await s.submit([t])
    e = await join(harness)
    await e.claim_one()
    await harness.advance(harness.ttl * 2)
    assert await s.expire() == 1
    assert await lines(s, t.id) == [("claimed", 1, "e1", None), ("expired", 1, "e1", None)]
    task = await s.get(t.id)
    assert task.state == "dead"
    assert task.error == {
        "type": "LeaseExpired",
        "message": "expert e1 lost its lease on the last attempt",
    }


# -- management ------------------------------------------------------------------------------


async def test_a_cancel_of_a_running_task_names_the_owner(harness: Harness) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    await e.claim_one()
    await s.cancel(t.id)
    assert await lines(s, t.id) == [("claimed", 1, "e1", None), ("cancelled", 1, "e1", None)]


async def test_a_cancel_of_a_pending_task_and_a_retry_by_hand(harness: Harness) -> None:
    s = harness.store
    t = spec()
    await s.submit([t])
    await s.cancel(t.id)
    await s.retry(t.id)
    assert await lines(s, t.id) == [("cancelled", 0, None, None), ("retried", 0, None, None)]


# -- dependants ------------------------------------------------------------------------------


async def test_the_last_dependency_to_succeed_makes_the_dependant_ready(harness: Harness) -> None:
    s = harness.store
    a, b = spec("a"), spec("b")
    child = spec("child", depends_on=[a.id, b.id])
    await s.submit([a, b, child])
    e = await join(harness)
    for c in await e.claim(2):
        assert await e.write("complete", c.id, c.fence) is None
    assert await lines(s, child.id) == [
        ("ready", 0, None, f"dependency {b.id} succeeded"),
    ]
    assert (await s.get(child.id)).state == "pending"


async def test_a_failed_dependency_kills_its_dependants_in_cascade(harness: Harness) -> None:
    """The drift that prompted the rulebook: SQLite recorded nothing here."""
    s = harness.store
    root = spec("root")
    child = spec("child", depends_on=[root.id])
    grandchild = spec("grandchild", depends_on=[child.id])
    await s.submit([root, child, grandchild])
    e = await join(harness)
    c = await e.claim_one()
    assert await e.write("fail", root.id, c.fence, retry_delay=None) is None
    why = f"dependency {root.id} ended dead"
    assert await lines(s, child.id) == [("dead", 0, None, why)]
    assert await error_of(s, child.id) == {"type": "DependencyFailed", "message": why}
    why2 = f"dependency {child.id} ended dead"
    assert await lines(s, grandchild.id) == [("dead", 0, None, why2)]


async def test_a_cancelled_dependency_kills_its_dependants(harness: Harness) -> None:
    s = harness.store
    root = spec("root")
    child = spec("child", depends_on=[root.id])
    await s.submit([root, child])
    await s.cancel(root.id)
    why = f"dependency {root.id} ended cancelled"
    assert await lines(s, child.id) == [("dead", 0, None, why)]


async def test_a_task_born_dead_records_its_error(harness: Harness) -> None:
    s = harness.store
    root = spec("root")
    await s.submit([root])
    await s.cancel(root.id)
    child = spec("child", depends_on=[root.id])
    await s.submit([child])
    task = await s.get(child.id)
    assert task.state == "dead"
    assert task.error == {
        "type": "DependencyFailed",
        "message": f"dependency {root.id} did not succeed",
    }


# -- refusals --------------------------------------------------------------------------------


async def refused(e: Expert, op: str, task_id: str, fence: int) -> FencedOut:
    out = await e.write(op, task_id, fence, retry_delay=0.0)
    assert isinstance(out, FencedOut), f"{op} at fence {fence} landed"
    return out


async def test_every_backend_gives_the_same_reason_for_a_refusal(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=5)
    await s.submit([t])
    e1, e2 = await join(harness, "e1"), await join(harness, "e2")
    c = await e1.claim_one()

    gone = await refused(e1, "complete", "no-such-task", 1)
    assert (gone.reason, gone.detail) == (Refusal.GONE, "no such task")

    stale = await refused(e1, "complete", t.id, c.fence + 1)
    assert (stale.reason, stale.detail) == (Refusal.STALE_FENCE, f"the task is at fence {c.fence}")

    other = await refused(e2, "complete", t.id, c.fence)
    assert (other.reason, other.detail) == (Refusal.NOT_OWNER, "e2 does not own it (owner: e1)")

    started = await refused(e1, "start", t.id, c.fence)  # it is running: start is for claimed
    assert (started.reason, started.detail) == (Refusal.NOT_OWNED, "the task is running")

    await harness.advance(harness.ttl * 2)
    lapsed = await refused(e1, "complete", t.id, c.fence)
    assert lapsed.reason in (Refusal.TASK_LEASE, Refusal.EXPERT_LEASE)
    assert "lapsed" in lapsed.detail
