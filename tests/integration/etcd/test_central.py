"""Central queues on etcd (dispatch.py): a central task is indexed out of the priority index
(``z/``, never ``q/``), its key moves when a leader gives it and goes with the claim; a plan
larger than one Txn is given whole; an assignment wakes the assignee's store; and a record
written before central queues reads as a compete task's."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.etcd import EtcdStore
from contend.store.etcd.record import Record
from contend.store.etcd.submit import new_record
from contend.store.port import ExpertInfo

pytestmark = pytest.mark.etcd

ANY = Capabilities()
NAME = "queue:c"


def central(n: int) -> TaskSpec:
    return TaskSpec.build("job", [n], queue="c", central=True)


async def keys_under(store: EtcdStore, part: str) -> list[str]:
    base = store._keys.k(part, "")
    return [kv.key[len(base) :].decode() for kv in await store._etcd.scan(base, keys_only=True)]


async def join(store: EtcdStore, name: str) -> str:
    return await store.register_expert(ExpertInfo(name, queues=("c", "default")), 30)


def test_a_record_written_before_central_queues_reads_as_a_compete_task() -> None:
    rec = new_record(central(1), TaskState.PENDING, None, 0, 1.0)
    rec.assignee = "a"
    assert Record.loads(rec.dumps()).central and Record.loads(rec.dumps()).assignee == "a"
    came = Record.__slots__.index("central")
    older = Record.loads(orjson.dumps(orjson.loads(rec.dumps())[:came]))
    assert not older.central and older.assignee is None


@pytest.mark.parametrize("read_txns", [False, True], ids=["ranges", "read-txn"])
async def test_a_central_task_is_indexed_out_of_q_and_its_key_moves_when_given(
    store: EtcdStore, read_txns: bool
) -> None:
    # a claim reads the tasks given to it with its session check: in one read-only Txn where
    # the server's are safe, else in ranges beside it (etcd 3.5.1, what the tests run)
    store._etcd.read_txns = read_txns
    (plain,) = await store.submit([TaskSpec.build("j")])  # older: first in claim order
    (c,) = await store.submit([central(1)])
    assert [k.rsplit("/", 1)[1] for k in await keys_under(store, "q")] == [plain.id]
    assert [k.split("/")[:2] for k in await keys_under(store, "z")] == [["c", "u"]]
    session = await join(store, "a")
    term = await store.lead("a", session, NAME, 10)
    assert term == 1
    assert await store.assign("a", session, NAME, term, {c.id: "a", plain.id: "a"}) == 1
    (given,) = await keys_under(store, "z")
    assert given.split("/")[:3] == ["c", "a", "a"] and given.endswith(c.id)
    # the task given to it goes before the others it may claim
    got = await store.claim("a", session, ["c", "default"], ANY, limit=1, lease_ttl=30)
    assert [g.id for g in got] == [c.id]
    got = await store.claim("a", session, ["c", "default"], ANY, limit=5, lease_ttl=30)
    assert [g.id for g in got] == [plain.id]
    assert await keys_under(store, "z") == [] and await keys_under(store, "q") == []
    kv = (await store._etcd.read_many([store._keys.task(c.id)]))[0]
    assert Record.loads(kv.value).assignee is None  # the claim used the assignment up


async def test_a_plan_larger_than_one_txn_is_given_whole(store_url: str) -> None:
    store = EtcdStore(store_url, timeout=3.0, max_txn_ops=16)  # four tasks a Txn
    await store.open()
    try:
        subs = await store.submit([central(i) for i in range(10)])
        session = await join(store, "a")
        term = await store.lead("a", session, NAME, 10)
        assert term is not None
        assert await store.assign("a", session, NAME, term, {s.id: "a" for s in subs}) == 10
        for s in subs:
            history = (await store.get(s.id, history=True)).history
            assert [e.expert for e in history if e.event == "assigned"] == ["a"]
        got = await store.claim("a", session, ["c"], ANY, limit=20, lease_ttl=30)
        assert sorted(g.id for g in got) == sorted(s.id for s in subs)
    finally:
        await store.close()


async def test_an_assignment_wakes_the_assignees_store(store: EtcdStore, store_url: str) -> None:
    (c,) = await store.submit([central(1)])
    a = await join(store, "a")
    term = await store.lead("a", a, NAME, 10)
    assert term is not None
    other = EtcdStore(store_url, timeout=3.0)
    await other.open()  # its watch starts after what it saw: the submission is before it
    try:
        waiting = asyncio.create_task(other.wait_for_change(20))
        t0 = time.monotonic()
        assert await store.assign("a", a, NAME, term, {c.id: "a"}) == 1
        await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - t0 < 10  # woken by the watch on z/, not by its timeout
    finally:
        await other.close()
