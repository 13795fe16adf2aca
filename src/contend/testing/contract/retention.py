"""The store contract: retention (``Store.prune``).

Old finished tasks go whole; young ones, unfinished ones and a dependency that a waiting task
still waits on stay; one pass deletes at most *limit*; bad arguments change nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contend.errors import ConfigError, TaskNotFound
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import P, join, snapshot, spec, state_of


async def test_prune_deletes_old_finished_tasks_whole_and_keeps_the_rest(harness: Harness) -> None:
    h = harness
    s = h.store
    done, failed, cancelled, pending, keyed = (
        spec(),
        spec(),
        spec(),
        spec(),
        spec(key="once"),
    )
    await s.submit([done, failed, cancelled, pending, keyed])
    e = await join(h)
    for t in (done, keyed):
        c = await e.claim_one(task_ids=[t.id])
        assert await e.write("complete", c.id, c.fence) is None
    c = await e.claim_one(task_ids=[failed.id])
    assert await e.write("fail", c.id, c.fence) is None  # no retry delay: it ends
    await s.cancel(cancelled.id)
    await h.advance(h.ttl)
    young = spec()
    await s.submit([young])
    c = await e.claim_one(task_ids=[young.id])
    assert await e.write("complete", c.id, c.fence) is None
    cutoff = await s.now() - h.ttl / 2  # after the first four ended, before the young one
    assert await s.prune(cutoff) == 4
    for t in (done, failed, cancelled, keyed):
        with pytest.raises(TaskNotFound):
            await s.get(t.id)
    assert await state_of(s, pending.id) == P
    assert (await s.get(young.id, history=True)).history  # kept, with its history
    again = await s.submit([replace(spec(), key="once")])  # a pruned task's key is free again
    assert again[0].created
    assert await s.prune(cutoff) == 0


async def test_prune_leaves_a_waiting_task_able_to_go_on(harness: Harness) -> None:
    # A dependency is settled when it ends (its waiter counts one fewer); a backend that
    # settles later (etcd's ended markers) must keep it until then. Either way the waiter,
    # still waiting on the other one, becomes pending when that one succeeds.
    h = harness
    s = h.store
    first, second = spec(), spec()
    waiter = replace(spec(), depends_on=(first.id, second.id))
    await s.submit([first, second, waiter])
    e = await join(h)
    c = await e.claim_one(task_ids=[first.id])
    assert await e.write("complete", c.id, c.fence) is None
    await h.advance(h.ttl)
    assert await s.prune(await s.now()) <= 1  # first at most
    assert await state_of(s, waiter.id) == "waiting"
    c = await e.claim_one(task_ids=[second.id])
    assert await e.write("complete", c.id, c.fence) is None
    await s.expire()  # where settling waits for housekeeping
    assert await state_of(s, waiter.id) == P


async def test_prune_takes_at_most_limit_tasks_a_pass(harness: Harness) -> None:
    h = harness
    s = h.store
    tasks = [spec() for _ in range(5)]
    await s.submit(tasks)
    for t in tasks:
        await s.cancel(t.id)
    await h.advance(h.ttl)
    now = await s.now()
    assert await s.prune(now, 2) == 2
    assert await s.prune(now, 2) == 2
    assert await s.prune(now, 2) == 1
    assert await s.prune(now, 2) == 0


@pytest.mark.parametrize(
    ("before", "limit", "keep"),
    [(float("nan"), 10, 5), ("soon", 10, 5), (1.0, 0, 5), (1.0, 10**9, 5), (1.0, 10, 0)],
)
async def test_prune_refuses_bad_arguments_and_changes_nothing(
    harness: Harness, before: object, limit: object, keep: object
) -> None:
    h = harness
    s = h.store
    t = spec()
    await s.submit([t])
    await s.cancel(t.id)
    await h.advance(h.ttl)
    before_state = await snapshot(s)
    with pytest.raises(ConfigError, match="prune"):
        await s.prune(before, limit, keep_events=keep)  # type: ignore[arg-type]
    assert await snapshot(s) == before_state


async def test_prune_caps_a_long_history_at_its_first_line_and_newest(harness: Harness) -> None:
    h = harness
    s = h.store
    t = spec()
    await s.submit([t])
    e = await join(h)
    for _ in range(65):  # claimed + released each time: 131 lines with "submitted"
        c = await e.claim_one(start=False, task_ids=[t.id])
        assert await e.write("release", c.id, c.fence) is None
    first = (await s.get(t.id, history=True)).history[0]
    await s.prune(await s.now() - 3600, keep_events=100)  # deletes nothing: t is pending
    history = (await s.get(t.id, history=True)).history
    assert len(history) <= 100  # etcd caps at 50 as it writes (store/etcd/record.py)
    assert history[0] == first
    assert history[-1].event == "released"
