"""The store contract: ending another expert's session (``Store.end_session``).

A supervisor that sees an expert's process die ends its session at once instead of waiting
for the lease to run out. The tests check that this is the expiry rule applied early — the
same outcomes, nothing more — and that it is fenced: the session's owner, were it alive
after all, can neither renew nor write, and a session that is not the current one is left
alone.
"""

from __future__ import annotations

import pytest

from contend.errors import LeaseLost
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import (
    DEAD,
    OWNER_WRITES,
    P,
    W,
    join,
    snapshot,
    spec,
    state_of,
)


async def test_end_session_expires_its_tasks_at_once_and_fences_its_owner(
    harness: Harness,
) -> None:
    s = harness.store
    kept, last = spec(max_attempts=3), spec(max_attempts=1)
    child = spec(depends_on=[last.id])
    other = spec()
    await s.submit([kept, last, child, other])
    e1, e2 = await join(harness, "e1"), await join(harness, "e2")
    got = {c.id: c for c in await e1.claim(2, task_ids=[kept.id, last.id])}
    assert await e1.write("checkpoint", kept.id, got[kept.id].fence, state={"page": 3}) is None
    mine = await e2.claim_one(task_ids=[other.id])
    supervisor = await harness.new_store()  # another connection, as a supervisor's would be

    assert await supervisor.end_session("e1", e1.session) == 2
    # no time passed: the tasks are back now, not when the lease would have run out
    task = await s.get(kept.id, history=True)
    assert (task.state, task.owner, task.lease_deadline) == (P, None, None)
    assert (task.attempts, task.fence, task.checkpoint) == (1, 1, {"page": 3})
    assert task.history[-1].event == "expired" and task.history[-1].expert == "e1"
    dead = await s.get(last.id)
    assert dead.state == DEAD and dead.error is not None
    assert dead.error["type"] == "LeaseExpired"
    assert await state_of(s, child.id) == DEAD  # its dependency died: it does too
    # the rest of the store is as it was
    assert (await s.get(other.id)).owner == "e2"
    assert await e2.renew() == {other.id: mine.fence}
    # fenced: the ended session can neither renew nor write, and changes nothing trying
    with pytest.raises(LeaseLost):
        await e1.renew()
    before = await snapshot(s)
    for op in OWNER_WRITES:
        assert await e1.write(op, kept.id, got[kept.id].fence) is not None, op
    with pytest.raises(LeaseLost):
        await e1.claim(5)
    assert await snapshot(s) == before
    assert not {x.info.id: x for x in await s.list_experts()}["e1"].alive
    # another expert takes the returned task at once, from its checkpoint
    again = await e2.claim_one(task_ids=[kept.id])
    assert (again.fence, again.attempt, again.checkpoint) == (2, 2, {"page": 3})
    assert await s.expire() == 0  # nothing was left for the lease to return


async def test_end_session_of_a_session_that_is_not_current_changes_nothing(
    harness: Harness,
) -> None:
    s = harness.store
    t, u = spec(), spec()
    await s.submit([t, u])
    old = await join(harness, "e1")
    await old.claim_one(task_ids=[t.id])
    before = await snapshot(s)
    assert await s.end_session("e1", "not-a-session") == 0
    assert await s.end_session("nobody", old.session) == 0
    assert await snapshot(s) == before
    held = await old.renew()
    assert set(held) == {t.id}
    # the name's session is replaced: ending the old one leaves the new one alone
    await harness.advance(harness.ttl * 1.5)
    assert await s.expire() == 1
    new = await join(harness, "e1")
    c = await new.claim_one(task_ids=[u.id])
    assert await s.end_session("e1", old.session) == 0
    assert await new.renew() == {u.id: c.fence}
    assert await new.write("complete", u.id, c.fence) is None


async def test_end_session_twice_returns_nothing_the_second_time(harness: Harness) -> None:
    s = harness.store
    t = spec()
    waiting = spec(depends_on=[t.id])
    await s.submit([t, waiting])
    e = await join(harness, "e1")
    await e.claim_one()
    assert await s.end_session("e1", e.session) == 1
    before = await snapshot(s)
    assert await s.end_session("e1", e.session) == 0
    assert await snapshot(s) == before
    assert await state_of(s, waiting.id) == W
    # the name is free again at once, as after a deregistration
    again = await join(harness, "e1")
    got = await again.claim_one()
    assert got.id == t.id and got.fence == 2
