"""The store contract: Fencing: every owner write lands only with the current fence, owner and lease; fail and release.

Times are moved with ``harness.advance``; leases use ``harness.ttl``. Nothing here sleeps to
synchronise: wake-ups are awaited with a deadline.
"""

from __future__ import annotations

import pytest

from contend.domain.retry import RetryPolicy
from contend.domain.task import TaskState
from contend.errors import (
    FencedOut,
    LeaseLost,
)
from contend.store.port import Completion
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import (
    DEAD,
    FAILED,
    OK,
    OWNER_WRITES,
    Expert,
    P,
    R,
    join,
    pass_time,
    snapshot,
    spec,
    state_of,
)

# -- fencing: every owner write ----------------------------------------------------------------


@pytest.mark.parametrize("op", OWNER_WRITES)
async def test_owner_write_with_the_current_fence_lands(harness: Harness, op: str) -> None:
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one(start=op not in ("start", "checkpoint", "progress"))
    if op in ("checkpoint", "progress"):
        assert await e.write("start", t.id, c.fence) is None
    assert await e.write(op, t.id, c.fence, state={"done": 3}) is None
    task = await s.get(t.id)
    expected = {
        "start": R,
        "checkpoint": R,
        "progress": R,
        "complete": OK,
        "fail": DEAD,
        "release": P,
    }[op]
    assert task.state == expected
    if op == "checkpoint":
        assert task.checkpoint == {"done": 3}
    if op == "progress":
        assert task.progress == {"done": 3, "total": 10, "note": None}
        assert task.checkpoint is None  # progress is not state
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


async def test_a_success_after_a_failed_attempt_shows_no_error(harness: Harness) -> None:
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e = await join(harness)
    first = await e.claim_one()
    assert await e.write("fail", t.id, first.fence, retry_delay=0.0) is None
    assert (await s.get(t.id)).error["type"] == "Boom"  # pending again: why it failed
    second = await e.claim_one()
    assert await e.write("complete", t.id, second.fence, result=42) is None
    task = await s.get(t.id, history=True)
    assert (task.state, task.result, task.error) == (OK, 42, None)
    assert [h.event for h in task.history].count("retry") == 1  # the history keeps it


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
