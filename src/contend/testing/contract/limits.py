"""Concurrency limits kept at claim time (``contend.domain.limits``), where the backend
promises them (``Promises.concurrency_limits``); a backend that does not refuses a task with a
limit at submit, writing nothing.

Part of the contract: every backend registered in ``backends.py`` must pass it.
"""

from __future__ import annotations

import asyncio

import pytest

from contend.domain.task import TaskSpec, TaskState
from contend.errors import ConfigError, TaskError
from contend.store.port import Completion
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import Expert, spec


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
