"""A task's own transaction on a real etcd: its compares, its keys, its size, and a stale
owner whose session lease etcd revoked (see conftest.py for the server)."""

from __future__ import annotations

import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import ConfigError, FencedOut, TaskError, TransactionConflict
from contend.store.etcd import EtcdStore, EtcdTransaction
from contend.store.port import Claimed, Completion, ExpertInfo

pytestmark = pytest.mark.etcd


async def claim(store: EtcdStore, n: int = 1, expert: str = "e") -> list[Claimed]:
    await store.submit([TaskSpec.build("job", []) for _ in range(n)])
    sid = await store.register_expert(ExpertInfo(expert), 30)
    return await store.claim(expert, sid, ["default"], Capabilities(), limit=n, lease_ttl=30)


def done(c: Claimed) -> Completion:
    return Completion(c.id, c.fence, '"ok"')


async def test_a_compare_of_the_tasks_own_that_fails_is_a_conflict(store: EtcdStore) -> None:
    (c,) = await claim(store)
    key = f"{store.options.prefix.decode().rstrip('/')}-app/flag"
    tx = await store.begin("e", c.id, c.fence)
    assert isinstance(tx, EtcdTransaction)
    tx.compare_value(key, "on")  # the key is absent: the compare fails
    tx.put(key + "-written", "x")
    with pytest.raises(TransactionConflict):
        await tx.commit(done(c))
    assert await store.read_key(key + "-written") is None
    task = await store.get(c.id)
    assert (task.state, task.owner) == (TaskState.RUNNING, "e")  # the claim holds
    tx = await store.begin("e", c.id, c.fence)  # run it again, the compare now true
    tx.compare_revision(key, 0)  # absent
    tx.put(key, "on")
    await tx.commit(done(c))
    assert await store.read_key(key) == b"on"
    assert (await store.get(c.id)).state == TaskState.SUCCEEDED


async def test_reads_are_compared_at_commit_and_writes_read_back(store: EtcdStore) -> None:
    a, b = await claim(store, 2)
    key = f"{store.options.prefix.decode().rstrip('/')}-app/n"
    ta, tb = await store.begin("e", a.id, a.fence), await store.begin("e", b.id, b.fence)
    assert await ta.get(key) is None
    ta.put(key, "1")
    assert await ta.get(key) == b"1"  # its own write
    assert await tb.get(key) is None
    tb.put(key, "1")
    await tb.commit(done(b))
    with pytest.raises(TransactionConflict):
        await ta.commit(done(a))  # what it read changed
    assert await store.read_key(key) == b"1"
    ta = await store.begin("e", a.id, a.fence)
    ta.put(key, str(int(await ta.get(key) or 0) + 1))
    ta.delete(key + "-none")
    await ta.commit(done(a))
    assert await store.read_key(key) == b"2"


async def test_keys_of_the_store_and_oversized_transactions_are_refused(
    store: EtcdStore,
) -> None:
    (c,) = await claim(store)
    tx = await store.begin("e", c.id, c.fence)
    with pytest.raises(ConfigError, match="under the store's prefix"):
        tx.put(store.options.prefix + b"t/x", "evil")
    with pytest.raises(ConfigError):
        tx.put("", "x")
    with pytest.raises(ConfigError):
        tx.compare_revision("k", -1)
    for n in range(store.options.max_txn_ops):
        tx.put(f"bulk/{n}", "x")
    with pytest.raises(TaskError, match="operations"):
        await tx.commit(done(c))
    assert await store.read_key("bulk/0") is None
    assert (await store.get(c.id)).state == TaskState.RUNNING


async def test_an_owner_whose_session_etcd_ended_is_fenced_out(store: EtcdStore) -> None:
    (c,) = await claim(store)
    tx = await store.begin("e", c.id, c.fence)
    tx.put("owned/effect", "1")
    (record,) = await store.list_experts()
    assert await store.end_session("e", record.session)  # as if the lease had run out
    with pytest.raises(FencedOut) as refused:
        await tx.commit(done(c))
    # end_session gives the task back at once (as expiry would later): no owner any more
    assert refused.value.reason == "not_owner"
    assert await store.read_key("owned/effect") is None
