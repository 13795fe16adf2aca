"""Concurrency limits kept at claim time (``contend.domain.limits``), where the backend
promises them (``Promises.concurrency_limits``); a backend that does not refuses a task with a
limit at submit, writing nothing.

Part of the contract: every backend registered in ``backends.py`` must pass it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contend.domain.limits import KeyState, Rate
from contend.domain.task import TaskSpec, TaskState
from contend.errors import ConfigError, TaskError
from contend.store.port import Completion
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import Expert, pass_time, spec


def limited(key: str, limit: int, *args: int) -> TaskSpec:
    return spec("job", *args, limit_key=key, concurrency_limit=limit)


async def _refused(h: Harness) -> bool:
    """On a backend that does not keep limits: check that it refuses them, writing nothing,
    and say so (True); the test then has nothing more to check."""
    if h.store.promises.concurrency_limits:
        return False
    with pytest.raises(ConfigError, match="concurrency limits"):
        await h.store.submit([spec("plain"), limited("k", 1)])
    assert await h.store.list_tasks() == []
    return True


async def test_a_claim_takes_no_more_of_a_key_than_its_limit(harness: Harness) -> None:
    h = harness
    if await _refused(h):
        return
    a = {s.id for s in await h.store.submit([limited("tenant:a", 2, i) for i in range(5)])}
    b = {s.id for s in await h.store.submit([limited("tenant:b", 3, i) for i in range(2)])}
    await h.store.submit([spec("job", 9), spec("job", 10)])
    e = await Expert.join(h.store, "e", h.ttl)
    got = await e.claim(20)
    ids = [c.id for c in got]
    assert len(ids) == 6, ids
    assert len(a & set(ids)) == 2  # tenant a: its limit
    assert b <= set(ids)  # tenant b: under its limit
    assert await e.claim(20) == []  # a is full; the rest are taken
    # one of tenant a ends: exactly one more of it may run
    done = next(c for c in got if c.id in a)
    assert await h.store.complete("e", [Completion(done.id, done.fence, "null")]) == [None]
    more = await e.claim(20)
    assert len(more) == 1 and more[0].id in a


async def test_named_claims_and_rivals_keep_the_limit(harness: Harness) -> None:
    h = harness
    if await _refused(h):
        return
    subs = await h.store.submit([limited("k", 3, i) for i in range(12)])
    experts = [await Expert.join(h.store, f"e{n}", h.ttl) for n in range(4)]
    ids = [s.id for s in subs]
    got = await asyncio.gather(*(e.claim(4, task_ids=ids) for e in experts))
    assert sum(len(g) for g in got) == 3
    assert len(await h.store.list_tasks(state=TaskState.RUNNING)) == 3


async def test_a_bad_limit_is_refused_before_anything_is_written(harness: Harness) -> None:
    for key, limit in (("k", 0), ("k", -1), ("k", True), (None, 2), ("", 2), ("k", None)):
        with pytest.raises(TaskError):
            spec("job", limit_key=key, concurrency_limit=limit)
    assert await harness.store.list_tasks() == []


# -- rate limits -------------------------------------------------------------------------------


def rated(key: str, rate: Rate, *args: int, **options: Any) -> TaskSpec:
    return spec("job", *args, limit_key=key, rate_limit=rate, **options)


async def _refused_rates(h: Harness) -> bool:
    """On a backend that does not keep rate limits: check that it refuses them, writing
    nothing (True: the test has nothing more to check)."""
    if h.store.promises.rate_limits:
        return False
    with pytest.raises(ConfigError, match="rate limits"):
        await h.store.submit([spec("plain"), rated("k", Rate.of("5/s"))])
    assert await h.store.list_tasks() == []
    return True


async def test_a_rate_limit_spaces_the_starts_of_its_key(harness: Harness) -> None:
    h = harness
    if await _refused_rates(h):
        return
    every = Rate.of((1, h.ttl))  # one start per ttl, back to back at most one
    slow = {s.id for s in await h.store.submit([rated("slow", every, i) for i in range(6)])}
    await h.store.submit([spec("job", 99), spec("job", 100)])
    e = await Expert.join(h.store, "e", h.ttl)
    first = [c.id for c in await e.claim(10)]
    assert len(first) == 3 and len(slow & set(first)) == 1, first  # one of the key, the rest
    assert await e.claim(10) == []  # the key has no room until its interval has passed
    await pass_time(h, h.ttl / 2, e)
    assert await e.claim(10) == []
    await pass_time(h, h.ttl / 2, e)
    again = await e.claim(10)
    assert len(again) == 1 and again[0].id in slow
    # unused time does not pile up beyond the burst (one here)
    await pass_time(h, 3 * h.ttl, e)
    assert len(await e.claim(10)) == 1


async def test_a_burst_lets_that_many_start_back_to_back(harness: Harness) -> None:
    h = harness
    if await _refused_rates(h):
        return
    three = Rate.of((1, h.ttl), burst=3)
    await h.store.submit([rated("k", three, i) for i in range(10)])
    e = await Expert.join(h.store, "e", h.ttl)
    assert len(await e.claim(10)) == 3
    assert await e.claim(10) == []
    await pass_time(h, h.ttl, e)
    assert len(await e.claim(10)) == 1  # one interval: room for one more


async def test_rivals_racing_for_named_tasks_keep_the_rate(harness: Harness) -> None:
    h = harness
    if await _refused_rates(h):
        return
    subs = await h.store.submit([rated("k", Rate.of((2, h.ttl)), i) for i in range(12)])
    experts = [await Expert.join(h.store, f"e{n}", h.ttl) for n in range(4)]
    ids = [s.id for s in subs]
    got = await asyncio.gather(*(e.claim(4, task_ids=ids) for e in experts))
    assert sum(len(g) for g in got) == 1
    got = await asyncio.gather(*(e.claim(4) for e in experts))
    assert sum(len(g) for g in got) == 0


async def test_a_bad_rate_is_refused_before_anything_is_written(harness: Harness) -> None:
    for bad in ("", "10", "x/s", "0/s", "-1/s", "5/0s", "5/w", (1, 0), (True, 1), "1e9/s", 7):
        with pytest.raises(TaskError, match="rate limit"):
            Rate.of(bad)  # type: ignore[arg-type]
    for burst in (0, -1, True, 1.5):
        with pytest.raises(TaskError, match="burst"):
            Rate.of("5/s", burst)  # type: ignore[arg-type]
    with pytest.raises(TaskError, match="needs a limit key"):
        spec("job", rate_limit=Rate.of("5/s"))
    assert await harness.store.list_tasks() == []


# -- fair share --------------------------------------------------------------------------------


def fair(key: str, *args: int, **options: Any) -> TaskSpec:
    return spec("job", *args, limit_key=key, fair=True, **options)


async def _refused_fair(h: Harness) -> bool:
    if h.store.promises.fair_share:
        return False
    with pytest.raises(ConfigError, match="fair share"):
        await h.store.submit([spec("plain"), fair("k")])
    assert await h.store.list_tasks() == []
    return True


async def test_a_burst_of_one_key_does_not_hold_back_another(harness: Harness) -> None:
    h = harness
    if await _refused_fair(h):
        return
    a = {s.id for s in await h.store.submit([fair("tenant:a", i) for i in range(40)])}
    b = {s.id for s in await h.store.submit([fair("tenant:b", i) for i in range(5)])}
    e = await Expert.join(h.store, "e", h.ttl)
    first = {c.id for c in await e.claim(4)}
    assert len(first & a) == 2 and len(first & b) == 2, first
    # one slot at a time: it goes to the key with fewer claimed or running
    one = (await e.claim_one()).id
    assert one in a  # even (2 and 2): the older head
    two = (await e.claim_one()).id
    assert two in b  # a has 3 now, b 2
    # b's last two go in the next claim though a still has 35 waiting; a fills the rest
    rest = {c.id for c in await e.claim(10)}
    assert b <= first | {two} | rest and len(rest & a) == 8, rest


async def test_fair_share_keeps_priority_and_takes_tasks_without_a_key(harness: Harness) -> None:
    h = harness
    if await _refused_fair(h):
        return
    await h.store.submit([fair("tenant:a", i) for i in range(20)])
    urgent = (await h.store.submit([fair("tenant:a", 99, priority=50)]))[0].id
    plain = (await h.store.submit([spec("job", 7)]))[0].id
    b = (await h.store.submit([fair("tenant:b", 1)]))[0].id
    e = await Expert.join(h.store, "e", h.ttl)
    got = [c.id for c in await e.claim(3)]
    assert urgent in got and b in got, got  # priority first, then b's share
    assert plain in {c.id for c in await e.claim(3)} | set(got)


async def test_peek_and_named_claims_keep_fair_share(harness: Harness) -> None:
    h = harness
    if await _refused_fair(h):
        return
    a = {s.id for s in await h.store.submit([fair("tenant:a", i) for i in range(30)])}
    b = {s.id for s in await h.store.submit([fair("tenant:b", i) for i in range(3)])}
    e = await Expert.join(h.store, "e", h.ttl)
    seen = [v.id for v in await h.store.peek(["default"], e.capabilities, 6)]
    assert len(set(seen) & b) == 3 and len(set(seen) & a) == 3, seen
    got = {c.id for c in await e.claim(2, task_ids=seen)}
    assert len(got & a) == 1 and len(got & b) == 1, got


async def test_a_key_that_refuses_places_leaves_them_to_the_others(harness: Harness) -> None:
    h = harness
    if await _refused_fair(h) or await _refused_rates(h):
        return
    slow = Rate.of((1, h.ttl))  # a: one start per ttl; b: no rate
    a = {s.id for s in await h.store.submit([fair("a", i, rate_limit=slow) for i in range(10)])}
    b = {s.id for s in await h.store.submit([fair("b", i) for i in range(10)])}
    e = await Expert.join(h.store, "e", h.ttl)
    got = {c.id for c in await e.claim(4)}
    assert len(got & a) == 1 and len(got & b) == 3, got  # the claim is not left short


async def test_the_store_reports_its_limit_keys_as_a_claim_sees_them(harness: Harness) -> None:
    # what `contend tasks show` and the dashboard say holds a task back (Store.key_states)
    h = harness
    if await _refused(h) or await _refused_rates(h):
        return
    every = Rate.of((1, h.ttl), burst=2)
    a1, a2, a3 = (s.id for s in await h.store.submit([limited("a", 2, i) for i in range(3)]))
    await h.store.submit([rated("r", every, i) for i in range(3)])
    (plain,) = await h.store.submit([spec("job", 9)])
    task = await h.store.get(a1)
    assert (task.limit_key, task.concurrency_limit, task.fair) == ("a", 2, False)
    assert (await h.store.get(plain.id)).limit_key is None
    assert await h.store.key_states([]) == {}
    before = await h.store.key_states(["a", "r", "never"])
    assert before["a"] == KeyState(0) and before["never"] == KeyState()
    assert (before["r"].held, before["r"].rate, before["r"].tat) == (0, every, None)
    e = await Expert.join(h.store, "e", h.ttl)
    got = {c.id for c in await e.claim(10)}
    assert len(got & {a1, a2, a3}) == 2 and len(got) == 5  # two of "a", two of "r", plain
    now = await h.store.now()
    after = await h.store.key_states(["a", "r"])
    assert after["a"].held == 2
    assert after["r"].held == 2 and after["r"].rate_room(now) == 0
    assert after["r"].tat is not None and after["r"].tat > now
    # a task's end frees its place
    done = [c for c in await h.store.list_tasks(state=TaskState.RUNNING) if c.limit_key == "a"]
    await h.store.complete("e", [Completion(done[0].id, done[0].fence, "1")])
    assert (await h.store.key_states(["a"]))["a"].held == 1
