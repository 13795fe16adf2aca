"""The etcd store keeps the auction's order at claim time (auctions.py): what a claim reads
and compares with and without auctions, and the races between a bid and a claim."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from contend.domain import auction
from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.etcd import EtcdStore
from contend.store.port import ExpertInfo
from contend.testing import FakeClock

pytestmark = pytest.mark.etcd

ANY = Capabilities()
Q = ["default"]


def spec() -> TaskSpec:
    return TaskSpec.build("work", [1])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[EtcdStore]:
    s = EtcdStore(store_url, clock=clock)
    await s.open()
    yield s
    await s.close()


def marked(kv: Any) -> bool:
    from contend.store.etcd import _Rec

    return bool(_Rec.loads(kv.value).auctioned)


async def record(store: EtcdStore, tid: str) -> Any:
    (kv,) = await store._etcd.read_many([store._keys.task(tid)])
    return kv


class Spy:
    """The keys a store reads and the compares of its claim transactions."""

    def __init__(self, store: EtcdStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read: list[bytes] = []
        self.compares: list[list[Any]] = []
        etcd = store._etcd
        reads, range_, commit = etcd.reads, etcd.range, etcd.commit

        async def reading(ops: Any) -> Any:
            self.read += [op[1] for op in ops]
            return await reads(ops)

        async def ranging(key: bytes, *args: Any, **kw: Any) -> Any:
            self.read.append(key)
            return await range_(key, *args, **kw)

        async def committing(compare: Any, *args: Any) -> Any:
            self.compares.append(list(compare))
            return await commit(compare, *args)

        monkeypatch.setattr(etcd, "reads", reading)
        monkeypatch.setattr(etcd, "range", ranging)
        monkeypatch.setattr(etcd, "commit", committing)

    def auction_reads(self, store: EtcdStore) -> list[bytes]:
        u, b = store._keys.k("u", ""), store._keys.k("b", "")
        return [k for k in self.read if k.startswith((u, b))]


async def test_a_claim_reads_no_auction_of_a_task_nobody_bid_on(
    store: EtcdStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    free, lot = spec(), spec()
    await store.submit([free, lot])
    s = await store.register_expert(ExpertInfo("a"), 10)
    spy = Spy(store, monkeypatch)
    (got,) = await store.claim("a", s, Q, ANY, limit=1, lease_ttl=10, task_ids=[free.id])
    assert got.id == free.id
    # nothing about auctions read; the Txn compares the record and the session, as before
    assert spy.auction_reads(store) == [] and [len(c) for c in spy.compares] == [2]

    opened = await store.bid("a", s, lot.id, 0.5, 1.0)
    assert marked(await record(store, lot.id))  # the opening bid marked the record
    clock.advance(1.0)
    spy.read.clear()
    (got,) = await store.claim("a", s, Q, ANY, limit=1, lease_ttl=10)
    assert got.id == lot.id and clock() >= opened.may_claim_at("a")
    # one read of its auction and bids; the Txn compares both as read, two compares more
    assert spy.auction_reads(store) == [store._keys.k("u", lot.id), store._keys.k("b", lot.id, "")]
    assert [len(c) for c in spy.compares] == [2, 4]


async def test_a_bid_landing_between_the_read_and_the_claim_fails_the_claim(
    store: EtcdStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bid placed at the close by a host whose clock is behind lands after the claim read
    # the ranking: the claim's Txn fails, and read again the task is not the claimant's yet
    (t,) = await store.submit([spec()])
    a = await store.register_expert(ExpertInfo("a"), 10)
    await store.register_expert(ExpertInfo("b"), 10)
    opened = await store.bid("a", a, t.id, 0.5, 1.0, grace=2.0)
    clock.advance(1.0)
    etcd, commit = store._etcd, store._etcd.commit
    late = json.dumps({"score": 0.9, "at": opened.closes_at - 0.001})

    async def a_bid_lands_first(*args: Any) -> Any:
        monkeypatch.setattr(etcd, "commit", commit)
        await etcd.txn([], [(0, store._keys.k("b", t.id, "b"), late.encode(), 0)])
        return await commit(*args)

    monkeypatch.setattr(etcd, "commit", a_bid_lands_first)
    assert await store.claim("a", a, Q, ANY, limit=1, lease_ttl=10, task_ids=[t.id]) == []
    assert (await store.get(t.id)).state == TaskState.PENDING
    clock.advance(2.0)  # b's grace is over: a's turn
    (got,) = await store.claim("a", a, Q, ANY, limit=1, lease_ttl=10, task_ids=[t.id])
    assert got.id == t.id


async def test_a_bid_opening_an_auction_after_a_claim_read_fails_the_claim(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    (t,) = await store.submit([spec()])
    a = await store.register_expert(ExpertInfo("a"), 10)
    b = await store.register_expert(ExpertInfo("b"), 10)
    etcd, commit = store._etcd, store._etcd.commit

    async def a_bid_first(*args: Any) -> Any:
        monkeypatch.setattr(etcd, "commit", commit)
        await store.bid("b", b, t.id, 0.5, 60.0)
        return await commit(*args)

    monkeypatch.setattr(etcd, "commit", a_bid_first)
    assert await store.claim("a", a, Q, ANY, limit=1, lease_ttl=10) == []
    assert await store.claim("b", b, Q, ANY, limit=1, lease_ttl=10) == []  # before the close
    assert [v.id for v in await store.peek(Q, ANY, 5)] == [t.id]  # bidders still see it


async def test_a_cleared_auction_is_forgotten_by_the_next_claim(
    store: EtcdStore, clock: FakeClock
) -> None:
    (t,) = await store.submit([spec()])
    a = await store.register_expert(ExpertInfo("a"), 10)
    await store.bid("a", a, t.id, 0.5, 0.5)
    clock.advance(0.5)
    (got,) = await store.claim("a", a, Q, ANY, limit=1, lease_ttl=10)
    await store.expire()  # the task is not pending: its auction goes
    assert await store._etcd.scan(store._keys.k("u", "")) == []
    assert await store.release("a", [(got.id, got.fence)]) == [None]
    kv = await record(store, t.id)
    assert marked(kv)  # still marked, and pending again with no auction
    (again,) = await store.claim("a", a, Q, ANY, limit=1, lease_ttl=10)
    assert again.id == t.id and not marked(await record(store, t.id))


async def test_an_auction_written_before_grace_was_kept_gets_the_default(
    store: EtcdStore, clock: FakeClock
) -> None:
    (t,) = await store.submit([spec()])
    a = await store.register_expert(ExpertInfo("a"), 10)
    b = await store.register_expert(ExpertInfo("b"), 10)
    closes = clock() + 1.0  # as an older contend wrote it: no grace, no mark on the record
    await store._etcd.txn(
        [], [(0, store._keys.k("u", t.id), json.dumps({"closes_at": closes}).encode(), 0)]
    )
    got = await store.bid("a", a, t.id, 0.9, 5.0, grace=3.0)
    assert (got.closes_at, got.grace) == (closes, auction.DEFAULT_GRACE)
    assert marked(await record(store, t.id))  # claims keep its order from now on
    await store.bid("b", b, t.id, 0.4, 5.0)
    clock.advance(1.0)
    assert await store.claim("b", b, Q, ANY, limit=1, lease_ttl=10) == []
    clock.advance(auction.DEFAULT_GRACE)
    assert [c.id for c in await store.claim("b", b, Q, ANY, limit=1, lease_ttl=10)] == [t.id]
