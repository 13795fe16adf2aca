"""The store contract: a task's own transaction (``Store.begin``) commits the task's effect and
its completion together, under the fence, or neither.

The effect is a counter in the store's own database (``Harness.counter``, by default
:func:`contend.testing.counters.counter_for`). A backend whose ``promises.transactions`` is
false must refuse ``begin`` with ConfigError, and every test checks that instead.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from contend.domain.transitions import IN_TRANSACTION
from contend.errors import ConfigError, FencedOut, TransactionConflict
from contend.store.port import Claimed, Completion, Store
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import OK, Expert, P, R, join, snapshot, spec, state_of
from contend.testing.counters import Counter


async def _counter(h: Harness, name: str = "hits") -> Counter | None:
    """The harness's counter, prepared; None (after checking that ``begin`` is refused) when
    the backend promises no transactions."""
    if not h.store.promises.transactions:
        e = await join(h, "nobody")
        try:
            await h.store.begin(e.name, "no-task", 1)
        except ConfigError:
            return None
        raise AssertionError("promises.transactions is false but begin() did not refuse")
    counter = h.counter(name)
    await counter.prepare()
    return counter


def _done(c: Claimed, result: Any = None) -> Completion:
    return Completion(c.id, c.fence, json.dumps(result))


async def _increment(store: Store, e: Expert, c: Claimed, counter: Counter, tries: int = 20) -> int:
    """Add one to *counter* and complete *c* in one transaction, again on a conflict; returns
    how many conflicts it met."""
    for n in range(tries):
        tx = await store.begin(e.name, c.id, c.fence)
        try:
            await counter.add(tx)
        except BaseException:
            await tx.rollback()
            raise
        try:
            await tx.commit(_done(c, "counted"))
        except TransactionConflict:
            await asyncio.sleep(0)
            continue
        return n
    raise AssertionError(f"{tries} conflicts in a row")


async def test_a_transaction_commits_its_effect_with_the_completion(harness: Harness) -> None:
    counter = await _counter(harness)
    if counter is None:
        return
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    tx = await s.begin(e.name, c.id, c.fence)
    await counter.add(tx)
    await tx.commit(_done(c, {"n": 1}))
    task = await s.get(t.id, history=True)
    assert task.state == OK
    assert task.result == {"n": 1}
    assert await counter.value() == 1
    done = [ev for ev in task.history if ev.event == "succeeded"]
    assert len(done) == 1 and done[0].expert == e.name and done[0].detail == IN_TRANSACTION
    # completed: neither the usual commit nor another transaction lands again
    assert await e.write("complete", t.id, c.fence) is not None
    try:
        await s.begin(e.name, c.id, c.fence)
    except FencedOut as exc:
        assert exc.reason in ("not_owner", "not_owned")
    else:
        raise AssertionError("a transaction opened on a completed task")
    assert await counter.value() == 1


async def test_a_rolled_back_transaction_writes_nothing_and_keeps_the_claim(
    harness: Harness,
) -> None:
    counter = await _counter(harness)
    if counter is None:
        return
    s = harness.store
    t = spec()
    await s.submit([t])
    e = await join(harness)
    c = await e.claim_one()
    tx = await s.begin(e.name, c.id, c.fence)
    await counter.add(tx, 5)
    await tx.rollback()
    await tx.rollback()  # twice is harmless
    assert await counter.value() == 0
    task = await s.get(t.id)
    assert (task.state, task.owner, task.fence) == (R, e.name, c.fence)
    # the claim still holds: the owner can run it again, in a transaction or not
    assert await _increment(s, e, c, counter) == 0
    assert await counter.value() == 1
    assert await state_of(s, t.id) == OK


async def test_a_stale_owner_cannot_open_a_transaction(harness: Harness) -> None:
    counter = await _counter(harness)
    if counter is None:
        return
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e1 = await join(harness, "e1")
    old = await e1.claim_one()
    await harness.advance(harness.ttl * 2)  # e1 stops renewing: its lease lapses
    await s.expire()
    e2 = await join(harness, "e2")
    new = await e2.claim_one()
    assert new.fence == old.fence + 1
    before = await snapshot(s)
    try:
        await s.begin(e1.name, old.id, old.fence)
    except FencedOut as exc:
        assert exc.reason in ("stale_fence", "not_owner")
    else:
        raise AssertionError("a stale owner opened a transaction")
    assert await snapshot(s) == before
    assert await counter.value() == 0


async def test_a_transaction_that_outlives_its_lease_is_rolled_back_whole(
    harness: Harness,
) -> None:
    counter = await _counter(harness)
    if counter is None:
        return
    s = harness.store
    t = spec(max_attempts=3)
    await s.submit([t])
    e1 = await join(harness, "e1")
    c1 = await e1.claim_one()
    tx = await s.begin(e1.name, c1.id, c1.fence)
    await counter.add(tx)
    await harness.advance(harness.ttl * 2)  # paused past its lease, inside the block
    try:
        await tx.commit(_done(c1, "late"))
    except FencedOut as exc:
        assert exc.reason in ("task_lease", "expert_lease"), exc
    else:
        raise AssertionError("a transaction committed after its lease lapsed")
    assert await counter.value() == 0
    assert (await s.get(t.id)).result is None
    await s.expire()
    assert await state_of(s, t.id) == P
    e2 = await join(harness, "e2")
    c2 = await e2.claim_one()
    await _increment(s, e2, c2, counter)
    task = await s.get(t.id, history=True)
    assert (task.state, task.result) == (OK, "counted")
    assert await counter.value() == 1
    assert [ev.expert for ev in task.history if ev.event == "succeeded"] == ["e2"]


async def test_a_transaction_whose_task_was_taken_over_is_rolled_back_whole(
    harness: Harness,
) -> None:
    """e1 opens its transaction and writes; its lease lapses and e2, through another
    connection, expires and claims the task. e1's commit is fenced out and nothing of it lands.
    Where a transaction holds the write lock (``exclusive_transactions``), e2 cannot take the
    task over until e1's transaction ends: its claim waits, then wins."""
    counter = await _counter(harness)
    if counter is None:
        return
    s = harness.store
    other = await harness.new_store()
    t = spec(max_attempts=3)
    await s.submit([t])
    e1 = await join(harness, "e1")
    c1 = await e1.claim_one()
    tx = await s.begin(e1.name, c1.id, c1.fence)
    await counter.add(tx)
    await harness.advance(harness.ttl * 2)

    async def take_over() -> tuple[Expert, Claimed]:
        e2 = await join(harness, "e2", store=other)
        await other.expire()
        return e2, await e2.claim_one()

    taking = asyncio.ensure_future(take_over())
    if s.promises.exclusive_transactions:
        for _ in range(50):
            await asyncio.sleep(0)
        assert not taking.done(), "a writer wrote while a task's transaction held the lock"
    else:
        _, c2 = await asyncio.wait_for(taking, 30)
        assert c2.fence == c1.fence + 1
    try:
        await tx.commit(_done(c1, "stale"))
    except FencedOut as exc:
        assert exc.reason in ("stale_fence", "not_owner", "task_lease", "expert_lease"), exc
    else:
        raise AssertionError("a stale owner's transaction committed")
    e2, c2 = await asyncio.wait_for(taking, 30)
    assert c2.fence == c1.fence + 1
    assert await counter.value() == 0
    await _increment(other, e2, c2, counter)
    assert await counter.value() == 1
    task = await s.get(t.id, history=True)
    assert (task.state, task.result, task.owner) == (OK, "counted", None)
    assert [ev.expert for ev in task.history if ev.event == "succeeded"] == ["e2"]


async def test_concurrent_transactions_each_count_once(harness: Harness) -> None:
    """Tasks incrementing one counter at once, each retrying on a conflict: every task ends
    succeeded and the counter counts each once (optimistic backends meet conflicts, others
    wait for a lock; none loses or doubles an increment)."""
    counter = await _counter(harness)
    if counter is None:
        return
    s = harness.store
    specs = [spec() for _ in range(6)]
    await s.submit(specs)
    experts = [await join(harness, f"e{n}") for n in range(3)]
    runs = [(e, c) for e in experts for c in await e.claim(2)]
    assert len(runs) == 6
    await asyncio.gather(*(_increment(s, e, c, counter) for e, c in runs))
    assert await counter.value() == 6
    for t in specs:
        task = await s.get(t.id, history=True)
        assert task.state == OK
        assert [ev.event for ev in task.history].count("succeeded") == 1
