"""Retention on the etcd store: prune() against a real etcd (conftest.py starts it).

The store's clock is a FakeClock, so that tasks are made "old" by moving it, not by waiting.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import ConfigError
from contend.store.etcd import EtcdStore, retention
from contend.store.etcd.txn import delete, put
from contend.store.port import Completion, ExpertInfo, Failure
from contend.testing import FakeClock

pytestmark = pytest.mark.etcd

ANY = Capabilities()
Q = ["default"]
T0 = 1_700_000_000.0
DAY = 86_400.0


def spec(**kw: Any) -> TaskSpec:
    return TaskSpec.build("work", [1], **kw)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[EtcdStore]:
    s = EtcdStore(store_url, clock=clock, timeout=3.0)
    await s.open()
    yield s
    await s.close()


async def all_keys(store: EtcdStore) -> list[str]:
    """Every key under the store's prefix, without the prefix."""
    p = store._keys.p
    return [kv.key[len(p) :].decode() for kv in await store._etcd.scan(p, keys_only=True)]


async def keys_of(store: EtcdStore, tid: str) -> list[str]:
    return [k for k in await all_keys(store) if tid in k]


async def cancelled(store: EtcdStore, *specs: TaskSpec) -> None:
    await store.submit(list(specs))
    for s in specs:
        await store.cancel(s.id)


async def ids(store: EtcdStore) -> set[str]:
    return {t.id for t in await store.list_tasks(limit=1000)}


async def test_old_finished_tasks_go_with_every_key_they_own(
    store: EtcdStore, clock: FakeClock
) -> None:
    big = "x" * 5_000  # more than INLINE_MAX: args, result and checkpoint under d/
    done, dead, keyed, bid_on = (
        TaskSpec.build("work", [big]),
        spec(max_attempts=1),
        spec(key="the-key"),
        spec(),
    )
    dep = spec()  # pending: the cancelled waiter's edge w/{dep}/{waiter} stays after it
    waiter = spec(depends_on=[dep.id])
    await store.submit([done, dead, keyed, bid_on, dep, waiter])
    s = await store.register_expert(ExpertInfo("e"), 10)
    await store.bid("e", s, bid_on.id, 1.0, 5.0)
    got = {c.id: c for c in await store.claim("e", s, Q, ANY, limit=2, lease_ttl=10)}
    assert set(got) == {done.id, dead.id}
    await store.checkpoint("e", done.id, got[done.id].fence, json.dumps(big))
    done_ = Completion(done.id, got[done.id].fence, json.dumps(big))
    assert await store.complete("e", [done_]) == [None]
    dead_ = Failure(dead.id, got[dead.id].fence, '{"type": "X"}', None)
    assert await store.fail("e", [dead_]) == [None]
    for t in (keyed, bid_on, waiter):
        await store.cancel(t.id)
    gone = [done, dead, keyed, bid_on, waiter]
    owned = {k.split("/")[0] for t in gone for k in await keys_of(store, t.id)}
    assert owned == {"t", "d", "u", "b", "w"}
    assert "k/the-key" in await all_keys(store)  # its value names the task

    clock.advance(DAY)
    young = spec()
    await cancelled(store, young)
    assert await store.prune(T0 + DAY / 2) == 5
    left = {k for k in await all_keys(store) if any(t.id in k for t in gone)}
    assert left == set()
    assert "k/the-key" not in await all_keys(store)
    assert await ids(store) == {dep.id, young.id}
    assert (await store.get(dep.id)).state == TaskState.PENDING
    assert (await store.get(young.id)).state == TaskState.CANCELLED
    assert await store.prune(T0 + DAY / 2) == 0
    # the dependency ends later: its waiter is gone, and nothing is left behind
    (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
    assert await store.complete("e", [Completion(dep.id, c.fence, "1")]) == [None]
    assert not [k for k in await all_keys(store) if k.startswith(("w/", "s/"))]


async def test_young_and_unfinished_tasks_stay(store: EtcdStore, clock: FakeClock) -> None:
    pending, waiting_on = spec(), spec()
    waiter = spec(depends_on=[waiting_on.id])
    await store.submit([pending, waiting_on, waiter])
    s = await store.register_expert(ExpertInfo("e"), 10)
    running = spec(priority=9)
    await store.submit([running])
    (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
    assert c.id == running.id
    clock.advance(DAY)
    young = spec()
    await cancelled(store, young)
    assert await store.prune(clock() + 1) == 1  # only the finished one: the young one
    assert await store.prune(T0 + DAY) == 0
    assert await ids(store) == {pending.id, waiting_on.id, waiter.id, running.id}


async def test_limit_is_respected_oldest_first(store: EtcdStore, clock: FakeClock) -> None:
    tasks = [spec() for _ in range(5)]
    for t in reversed(tasks):  # changed in the reverse order of their ids
        await cancelled(store, t)
        clock.advance(1)
    assert await store.prune(clock(), limit=2) == 2
    assert await ids(store) == {t.id for t in tasks[:3]}
    assert await store.prune(clock(), limit=2) == 2
    assert await store.prune(clock(), limit=2) == 1
    assert await store.prune(clock(), limit=2) == 0
    assert await ids(store) == set()


async def test_a_dependency_a_waiting_task_waits_on_stays(
    store: EtcdStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dependency stays while a waiting task's edge on it is unsettled: its waiters not
    told yet (the ``s/`` marker of a crash before settle()), or an edge left behind. Once it
    has told its waiters, nothing needs it: it goes even while they wait on others."""
    a, b = spec(), spec(priority=-1)
    c = spec(depends_on=[a.id, b.id])
    await store.submit([a, b, c])
    s = await store.register_expert(ExpertInfo("e"), 10)
    (got,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
    assert got.id == a.id
    dependants = store._owner._dependants

    async def crash(task_ids: Any) -> None:  # the process died before telling the waiters
        list(task_ids)

    with monkeypatch.context() as m:
        m.setattr(dependants, "settle_many", crash)
        assert await store.complete("e", [Completion(a.id, got.fence, "1")]) == [None]
    marker = store._keys.k("s", a.id)
    assert (await store._etcd.read_many([marker]))[0] is not None
    clock.advance(DAY)
    assert await store.prune(clock()) == 0  # the marker: c is still to be told
    await store._etcd.txn([], [delete(marker)])
    assert await store.prune(clock()) == 0  # c's edge on a, c waiting
    await store._etcd.txn([], [put(marker, "succeeded")])
    await store.expire()  # settles what the crash left
    assert (await store.get(c.id)).state == TaskState.WAITING  # on b
    assert await store.prune(clock()) == 1
    assert await ids(store) == {b.id, c.id}
    (got,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
    assert await store.complete("e", [Completion(b.id, got.fence, "2")]) == [None]
    assert (await store.get(c.id)).state == TaskState.PENDING
    clock.advance(DAY)
    assert await store.prune(clock()) == 1
    assert await ids(store) == {c.id}
    assert not [k for k in await all_keys(store) if k.startswith(("w/", "s/"))]


async def test_an_edge_of_a_waiter_that_no_longer_waits_does_not_keep_its_dependency(
    store: EtcdStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = spec()
    c = spec(depends_on=[a.id])
    await store.submit([a, c])
    s = await store.register_expert(ExpertInfo("e"), 10)
    (got,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
    with monkeypatch.context() as m:
        m.setattr(store._owner._dependants, "settle_many", lambda ids: _nothing())
        assert await store.complete("e", [Completion(a.id, got.fence, "1")]) == [None]
    await store._etcd.txn([], [delete(store._keys.k("s", a.id))])  # settle() gave up
    await store.cancel(c.id)
    clock.advance(DAY)
    assert await store.prune(clock()) == 2
    others = ("e/", "l/", "x/", "v/")  # the expert's session and the queue's level
    assert {k for k in await all_keys(store) if not k.startswith(others)} == {"meta"}


async def _nothing() -> None:
    return None


async def test_a_pruned_task_frees_its_key(store: EtcdStore, clock: FakeClock) -> None:
    first = spec(key="once")
    await cancelled(store, first)
    (again,) = await store.submit([spec(key="once")])
    assert again.id == first.id and not again.created
    clock.advance(DAY)
    assert await store.prune(clock()) == 1
    second = spec(key="once")
    (out,) = await store.submit([second])
    assert out.created and out.id == second.id
    # a key that names another task now is not the pruned one's to free
    await store.cancel(second.id)
    clock.advance(DAY)
    assert await store.prune(clock()) == 1
    assert not [k for k in await all_keys(store) if k.startswith("k/")]


@pytest.mark.parametrize(
    ("before", "limit", "keep_events"),
    [
        (math.nan, 10, 100),
        ("yesterday", 10, 100),
        (True, 10, 100),
        (T0 + DAY, 0, 100),
        (T0 + DAY, 100_001, 100),
        (T0 + DAY, True, 100),
        (T0 + DAY, 2.0, 100),
        (T0 + DAY, 10, 0),
        (T0 + DAY, 10, False),
    ],
)
async def test_bad_arguments_raise_config_error_and_change_nothing(
    store: EtcdStore, before: Any, limit: Any, keep_events: Any
) -> None:
    t = spec(key="k")
    await cancelled(store, t)
    keys = await all_keys(store)
    with pytest.raises(ConfigError, match="prune"):
        await store.prune(before, limit, keep_events=keep_events)
    assert await all_keys(store) == keys


async def test_a_task_retried_meanwhile_is_not_deleted(
    store: EtcdStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, other = spec(), spec()
    await cancelled(store, t, other)
    clock.advance(DAY)
    etcd = store._etcd
    txn = etcd.txn
    tkey = store._keys.task(t.id)
    retried = False

    async def retry_first(compare: Sequence[Any], success: Sequence[Any], *a: Any) -> Any:
        nonlocal retried
        if not retried and any(op[0] == 1 and op[1] == tkey for op in success):
            retried = True  # a retry by hand between prune's read and its delete
            await store.retry(t.id)
        return await txn(compare, success, *a)

    monkeypatch.setattr(etcd, "txn", retry_first)
    assert await store.prune(clock()) == 1  # the other one: the batch is tried task by task
    assert retried
    back = await store.get(t.id)
    assert back.state == TaskState.PENDING and back.args == [1]
    assert await ids(store) == {t.id}


async def test_prune_batches_within_max_txn_ops(store_url: str, clock: FakeClock) -> None:
    """Many tasks go several to a Txn, and a waiter with more edges than one Txn holds goes in
    several, each under its record's revision; no Txn carries more than max_txn_ops."""
    store = EtcdStore(store_url, clock=clock, max_txn_ops=16)
    await store.open()
    try:
        deps = [spec() for _ in range(20)]
        waiter = spec(depends_on=[d.id for d in deps])
        await store.submit([*deps, waiter])
        await store.cancel(waiter.id)
        many = [spec(key=f"k{i}") for i in range(30)]
        await cancelled(store, *many)
        clock.advance(DAY)
        sizes: list[tuple[int, int]] = []
        txn = store._etcd.txn

        async def counting(compare: Sequence[Any], success: Sequence[Any], *a: Any) -> Any:
            sizes.append((len(compare), len(success)))
            return await txn(compare, success, *a)

        store._etcd.txn = counting  # type: ignore[method-assign]
        assert await store.prune(clock()) == 31
        assert max(max(c, o) for c, o in sizes) <= 15  # the guard's compare makes 16
        assert len(sizes) < 31  # several tasks to a Txn
        assert await keys_of(store, waiter.id) == []
        assert await ids(store) == {d.id for d in deps}
        assert not [k for k in await all_keys(store) if k.startswith(("k/", "w/"))]
    finally:
        await store.close()


def made_at(t: float) -> TaskSpec:
    """A task whose id says it was made at *t*, as ``new_task_id`` on that clock would."""
    return dataclasses.replace(spec(), id=f"{int(t * 1000):012x}{uuid.uuid4().hex[:16]}")


async def test_a_pass_reads_a_bounded_window_and_gets_past_an_old_backlog(
    store: EtcdStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten old pending tasks fill the head of the window; the finished ones behind them are
    still found, by the half of the window that starts at a random creation time."""
    monkeypatch.setattr(retention, "SCAN_MIN", 10)
    monkeypatch.setattr(retention, "PAGE", 3)
    monkeypatch.setattr(retention, "random", random.Random(7))
    backlog = []
    for _ in range(10):
        backlog.append(made_at(clock()))
        clock.advance(1)
    await store.submit(backlog)
    done = []
    for _ in range(10):
        done.append(made_at(clock()))
        await cancelled(store, done[-1])
        clock.advance(1)
    read = [0]
    rng = store._etcd.range
    tasks = store._keys.k("t", "")

    async def counting(key: bytes, *a: Any, **kw: Any) -> Any:
        resp = await rng(key, *a, **kw)
        if key.startswith(tasks):
            read[-1] += len(resp.kvs)
        return resp

    monkeypatch.setattr(store._etcd, "range", counting)
    passes = 0
    while await ids(store) != {t.id for t in backlog}:
        passes += 1
        assert passes < 50, "the finished tasks behind the backlog were not reached"
        read[0] = 0
        assert await store.prune(clock(), limit=2) <= 2
        assert read[0] <= 10  # SCAN_MIN: the window's bound
        read[0] = 0  # list_tasks reads them all
    assert await store.prune(clock(), limit=2) == 0
