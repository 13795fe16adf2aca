"""Ownership keys on a real etcd: one ``h/{expert}/{session}/{batch}`` key per claim Txn,
listing its tasks, and gone once none of them is held (src/contend/store/etcd/ownership.py)."""

from __future__ import annotations

import json

import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.etcd import DELETE, PUT, EtcdStore
from contend.store.port import Completion, ExpertInfo, Heartbeat

pytestmark = pytest.mark.etcd

ANY = Capabilities()
Q = ["default"]


def spec(**kw: object) -> TaskSpec:
    return TaskSpec.build("work", [1], **kw)  # type: ignore[arg-type]


async def ownership_keys(store: EtcdStore, expert: str) -> dict[bytes, list[str]]:
    """{key: the tasks it lists} of *expert*'s ownership keys."""
    kvs = await store._etcd.scan(store._keys.batches(expert))
    return {kv.key: json.loads(kv.value) for kv in kvs}


async def test_one_key_per_claim_gone_with_the_last_of_its_tasks(store: EtcdStore) -> None:
    tasks = [spec() for _ in range(3)]
    await store.submit(tasks)
    s = await store.register_expert(ExpertInfo("e"), 30)
    got = await store.claim("e", s, Q, ANY, limit=3, lease_ttl=30)
    assert len(got) == 3
    (listed,) = (await ownership_keys(store, "e")).values()
    assert sorted(listed) == sorted(t.id for t in tasks)
    first, *rest = got
    assert await store.complete("e", [Completion(first.id, first.fence, "1")]) == [None]
    assert len(await ownership_keys(store, "e")) == 1  # two of its tasks are still held
    done = await store.complete("e", [Completion(c.id, c.fence, "1") for c in rest])
    assert done == [None, None]
    assert await ownership_keys(store, "e") == {}


async def test_a_stolen_tasks_key_goes_at_its_victims_next_renew(store_url: str) -> None:
    """The thief's claim puts a key of its own; the victim's key still lists the task,
    whose record names the thief, until the victim's renew reads that record."""
    victim, thief = EtcdStore(store_url), EtcdStore(store_url)
    await victim.open()
    await thief.open()
    try:
        a, b = spec(), spec()
        await victim.submit([a, b])
        sv = await victim.register_expert(ExpertInfo("v"), 30)
        st = await thief.register_expert(ExpertInfo("t"), 30)
        got = await victim.claim("v", sv, Q, ANY, limit=2, lease_ttl=30, start=False)
        assert len(got) == 2
        (stolen,) = await thief.steal("t", st, "v", Q, ANY, limit=1, lease_ttl=30)
        kept = next(c for c in got if c.id != stolen.id)
        assert list((await ownership_keys(thief, "t")).values()) == [[stolen.id]]
        assert await victim.start("v", [(kept.id, kept.fence)]) == [None]
        done = await victim.complete("v", [Completion(kept.id, kept.fence, "1")])
        assert done == [None]
        assert len(await ownership_keys(victim, "v")) == 1  # it lists the stolen task
        assert await victim.renew("v", sv, 30, Heartbeat()) == {}
        assert await ownership_keys(victim, "v") == {}
        assert (await thief.renew("t", st, 30, Heartbeat())) == {stolen.id: stolen.fence}
    finally:
        await victim.close()
        await thief.close()


async def test_an_ended_session_returns_its_tasks_and_leaves_no_key(store: EtcdStore) -> None:
    tasks = [spec() for _ in range(4)]
    await store.submit(tasks)
    s = await store.register_expert(ExpertInfo("e"), 30)
    one = await store.claim("e", s, Q, ANY, limit=2, lease_ttl=30)
    two = await store.claim("e", s, Q, ANY, limit=2, lease_ttl=30)
    done = await store.complete("e", [Completion(one[0].id, one[0].fence, "1")])
    assert done == [None]
    assert len(await ownership_keys(store, "e")) == 2
    assert await store.end_session("e", s) == 3
    assert await ownership_keys(store, "e") == {}
    states = {t.id: (await store.get(t.id)).state for t in tasks}
    assert sorted(states.values()) == sorted([TaskState.SUCCEEDED] + [TaskState.PENDING] * 3)
    assert all(c.id in states for c in two)


async def test_a_schema_5_key_of_an_ended_session_is_returned_after_the_upgrade(
    store_url: str,
) -> None:
    """A schema-5 store keeps a key per claimed task, ``a/{expert}/{task}``; a session that
    ended before the upgrade still has its task returned by expire()."""
    old = EtcdStore(store_url)
    await old.open()
    t = spec()
    await old.submit([t])
    s = await old.register_expert(ExpertInfo("e"), 30)
    (c,) = await old.claim("e", s, Q, ANY, limit=1, lease_ttl=30)
    # as schema 5 left it: a per-task key, no batch key, and the session's lease gone
    etcd, keys = old._etcd, old._keys
    (bkey,) = await ownership_keys(old, "e")
    legacy = keys.legacy_held("e") + t.id.encode()
    meta = keys.k("meta")
    five = json.dumps({**json.loads((await etcd.read_many([meta]))[0].value), "schema": 5}).encode()
    await etcd.txn([], [(DELETE, bkey, b"")])
    await old.deregister_expert("e", s)
    await etcd.txn([], [(PUT, legacy, f"{c.fence} {s}".encode(), 0), (PUT, meta, five, 0)])
    await old.close()
    new = EtcdStore(store_url)
    await new.open()
    try:
        assert await new.expire() == 1
        assert (await new.get(t.id)).state == TaskState.PENDING
        assert await etcd_keys(new, keys.legacy_held("e")) == []
        assert await etcd_keys(new, keys.k("x", "")) == []
    finally:
        await new.close()


async def etcd_keys(store: EtcdStore, prefix: bytes) -> list[bytes]:
    return [kv.key for kv in await store._etcd.scan(prefix, keys_only=True)]
