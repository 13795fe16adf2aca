"""The etcd store keeps concurrency limits at claim time (claims.py, holder keys ``n/``):
rival store instances never hold more of a key than its limit, every way out of claimed or
running frees the place in the same Txn, and a claim of tasks without a limit costs what it
did before."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from contend.domain.limits import KeyState, Rate
from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.etcd import EtcdStore
from contend.store.etcd.record import Record
from contend.store.etcd.submit import new_record
from contend.store.port import Completion, ExpertInfo, Failure
from contend.testing import FakeClock

pytestmark = pytest.mark.etcd

ANY = Capabilities()
Q = ["default"]


def limited(key: str, limit: int, n: int) -> TaskSpec:
    return TaskSpec.build("job", [n], limit_key=key, concurrency_limit=limit)


def test_a_record_written_before_limits_reads_as_one_without_a_limit() -> None:
    rec = new_record(limited("k", 3, 0), TaskState.PENDING, None, 0, 1.0)
    assert Record.loads(rec.dumps()).limit == ["k", 3]
    # the array before the field came (and the fields after it)
    came = Record.__slots__.index("limit")
    older = orjson.dumps(orjson.loads(rec.dumps())[:came])
    assert Record.loads(older).limit is None and Record.loads(older).limit_key is None


async def holders(store: EtcdStore, key: str) -> int:
    prefix = store._keys.holders(key)
    ((n, _),) = await store._etcd.counts([prefix])
    return n


async def held(store: EtcdStore) -> int:
    claimed = await store.list_tasks(state=TaskState.CLAIMED)
    running = await store.list_tasks(state=TaskState.RUNNING)
    return len(claimed) + len(running)


async def test_six_instances_claiming_at_once_never_hold_more_than_the_limit(
    store_url: str,
) -> None:
    stores = [EtcdStore(store_url, timeout=5.0) for _ in range(6)]
    for s in stores:
        await s.open()
    try:
        subs = await stores[0].submit([limited("tenant:a", 3, i) for i in range(30)])
        sessions = [await s.register_expert(ExpertInfo(f"e{n}"), 30) for n, s in enumerate(stores)]
        inflight = 0  # tasks claimed and not yet sent to complete: never more than the store holds
        peak = 0
        done: set[str] = set()
        rng = random.Random(7)

        async def worker(n: int) -> None:
            nonlocal inflight, peak
            s, session, me = stores[n], sessions[n], f"e{n}"
            idle = 0
            while len(done) < len(subs) and idle < 400:
                got = await s.claim(me, session, Q, ANY, limit=2, lease_ttl=30)
                if not got:
                    idle += 1
                    await asyncio.sleep(0.005)
                    continue
                inflight += len(got)
                peak = max(peak, inflight)
                assert inflight <= 3, inflight
                assert await holders(s, "tenant:a") <= 3
                await asyncio.sleep(rng.random() * 0.01)
                inflight -= len(got)
                items = [Completion(c.id, c.fence, "null") for c in got]
                assert await s.complete(me, items) == [None] * len(got)
                done.update(c.id for c in got)

        await asyncio.gather(*(worker(n) for n in range(6)))
        assert done == {s.id for s in subs}
        assert 1 <= peak <= 3
        assert await holders(stores[0], "tenant:a") == 0
    finally:
        for s in stores:
            await s.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[EtcdStore]:
    s = EtcdStore(store_url, clock=clock)
    await s.open()
    yield s
    await s.close()


async def test_every_way_out_of_claimed_or_running_frees_the_place(store: EtcdStore) -> None:
    await store.submit([limited("k", 2, i) for i in range(10)])
    a = await store.register_expert(ExpertInfo("a"), 10)
    b = await store.register_expert(ExpertInfo("b"), 10)

    async def claim(who: str, session: str, n: int = 5, start: bool = True) -> list[Any]:
        return await store.claim(who, session, Q, ANY, limit=n, lease_ttl=10, start=start)

    async def full() -> None:
        assert await claim("a", a) == [] and await claim("b", b) == []
        assert await holders(store, "k") == 2 and await held(store) == 2

    x, _ = await claim("a", a)
    await full()
    # complete
    assert await store.complete("a", [Completion(x.id, x.fence, "1")]) == [None]
    (x,) = await claim("a", a)
    await full()
    # fail, to be tried again: back to pending, the place free
    assert await store.fail("a", [Failure(x.id, x.fence, '"e"', 0.0)]) == [None]
    (x,) = await claim("a", a)
    await full()
    # release (the claims start the tasks: running)
    assert await store.release("a", [(x.id, x.fence)]) == [None]
    (x,) = await claim("b", b, start=False)  # claimed, not started: it may be stolen
    await full()
    # a steal keeps the place: still two held
    (stolen,) = await store.steal("a", a, "b", Q, ANY, limit=1, lease_ttl=10)
    assert stolen.id == x.id
    await full()
    # the lease lapses: held until expire() returns the tasks, then free
    assert await store.revoke_lease("a")
    assert await claim("b", b) == [] and await holders(store, "k") == 2
    assert await store.expire() == 2
    assert await holders(store, "k") == 0
    got = await claim("b", b)
    assert len(got) == 2
    # a cancel of a running task frees its place
    await store.cancel(got[0].id)
    assert await holders(store, "k") == 1
    assert len(await claim("b", b)) == 1


class Spy:
    """The compares of claim transactions and the holder counts read."""

    def __init__(self, store: EtcdStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compares: list[list[Any]] = []
        self.counted: list[list[bytes]] = []
        etcd = store._etcd
        commit, counts = etcd.commit, etcd.counts

        async def committing(compare: Any, *args: Any) -> Any:
            self.compares.append(list(compare))
            return await commit(compare, *args)

        async def counting(prefixes: Any) -> Any:
            if prefixes:
                self.counted.append(list(prefixes))
            return await counts(prefixes)

        monkeypatch.setattr(etcd, "commit", committing)
        monkeypatch.setattr(etcd, "counts", counting)


async def test_a_claim_without_limits_costs_nothing_more(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = [TaskSpec.build("job", [i]) for i in range(3)]
    keyed = [limited("t:a", 5, 0), limited("t:a", 5, 1), limited("t:b", 5, 2)]
    await store.submit(plain)
    s = await store.register_expert(ExpertInfo("a"), 10)
    spy = Spy(store, monkeypatch)
    assert len(await store.claim("a", s, Q, ANY, limit=3, lease_ttl=10)) == 3
    # no count read; the Txn compares the three records and the session, as before
    assert spy.counted == [] and [len(c) for c in spy.compares] == [4]
    await store.submit(keyed)
    spy.compares.clear()
    assert len(await store.claim("a", s, Q, ANY, limit=3, lease_ttl=10)) == 3
    # one count read of both keys; one compare more per limit key, not per task
    assert [sorted(c) for c in spy.counted] == [
        sorted([store._keys.holders("t:a"), store._keys.holders("t:b")])
    ]
    assert [len(c) for c in spy.compares] == [6]
    assert await holders(store, "t:a") == 2 and await holders(store, "t:b") == 1


async def test_a_rival_taking_the_last_place_fails_the_claim_and_it_counts_again(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = await store.submit([limited("k", 1, 0), limited("k", 1, 1)])
    a = await store.register_expert(ExpertInfo("a"), 10)
    etcd, commit = store._etcd, store._etcd.commit
    commits = 0

    async def rival_first(compare: Any, *args: Any) -> Any:
        # the rival claims the other task of the key between a's count and a's Txn
        nonlocal commits
        commits += 1
        if commits == 1:
            monkeypatch.setattr(etcd, "commit", commit)
            b = await store.register_expert(ExpertInfo("b"), 10)
            other = second.id if first.id in str(compare) else first.id
            (won,) = await store.claim("b", b, Q, ANY, limit=1, lease_ttl=10, task_ids=[other])
            assert won.id == other
            monkeypatch.setattr(etcd, "commit", rival_first)
        return await commit(compare, *args)

    monkeypatch.setattr(etcd, "commit", rival_first)
    assert await store.claim("a", a, Q, ANY, limit=1, lease_ttl=10) == []
    assert await holders(store, "k") == 1 and await held(store) == 1


async def test_a_claim_reads_past_a_head_of_tasks_whose_key_is_full(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 100 tasks of one key limited to 1 stand first in the queue, more than a claim's page
    crowd = await store.submit([limited("t:a", 1, i) for i in range(100)])
    rest = await store.submit([limited("t:b", 5, i) for i in range(3)])
    rest += await store.submit([TaskSpec.build("job", [i]) for i in range(2)])
    s = await store.register_expert(ExpertInfo("e"), 10)
    etcd, read_many = store._etcd, store._etcd.read_many
    records: list[bytes] = []

    async def reading(keys: Any) -> Any:
        records.extend(k for k in keys if k.startswith(store._keys.k("t", "")))
        return await read_many(keys)

    monkeypatch.setattr(etcd, "read_many", reading)
    got = await store.claim("e", s, Q, ANY, limit=5, lease_ttl=10)
    ids = [c.id for c in got]
    assert ids[0] == crowd[0].id and ids[1:] == [t.id for t in rest[:4]]
    # the other tasks of t:a are passed over by their index values, their records unread
    assert len(records) < 20, len(records)
    (last,) = await store.claim("e", s, Q, ANY, limit=5, lease_ttl=10)
    assert last.id == rest[4].id


@pytest.mark.parametrize("read_txns", [False, True], ids=["ranges", "read-txn"])
async def test_key_states_reads_every_key_in_as_few_reads_as_the_txn_limit_allows(
    store_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, read_txns: bool
) -> None:
    # max_txn_ops 16: a read-only Txn carries 15 operations, 7 keys (two reads each)
    store = EtcdStore(store_url, clock=clock, max_txn_ops=16)
    await store.open()
    try:
        store._etcd.read_txns = read_txns  # etcd 3.5.1 (the tests' own) reads in ranges
        every = Rate.of((1, 60.0), burst=2)
        names = [f"k/{n:02}" for n in range(20)]  # a "/" in a key is encoded
        specs = [
            TaskSpec.build(
                "job", [n, i], limit_key=k, concurrency_limit=9, rate_limit=every if n % 2 else None
            )
            for n, k in enumerate(names)
            for i in range(n % 3 + 1)  # 1 to 3 tasks a key
        ]
        await store.submit(specs)
        (fair,) = await store.submit([TaskSpec.build("job", limit_key="f", fair=True)])
        got = await store.get(fair.id)
        assert (got.limit_key, got.concurrency_limit, got.fair) == ("f", None, True)
        s = await store.register_expert(ExpertInfo("a"), 60)
        taken = 0
        while got_some := await store.claim("a", s, Q, ANY, limit=100, lease_ttl=60):
            taken += len(got_some)
        assert taken == len(specs) - 3 + 1  # a rated key starts two, then none
        calls: list[int] = []
        reads = store._etcd.reads

        async def reading(ops: Any) -> Any:
            calls.append(len(ops))
            return await reads(ops)

        monkeypatch.setattr(store._etcd, "reads", reading)
        asked = [*names, "never", names[0]]  # a key asked for twice is read once
        states = await store.key_states(asked)
        assert calls == [14, 14, 14] and max(calls) <= store._etcd.max_ops
        assert set(states) == set(asked) and states["never"] == KeyState()
        now = clock()
        for n, k in enumerate(names):
            state, tasks = states[k], n % 3 + 1
            if n % 2:
                assert state.held == min(tasks, 2) and state.rate == every, (k, state)
                assert state.tat is not None and state.rate_room(now) == 2 - state.held
            else:
                assert state == KeyState(tasks), (k, state)
        calls.clear()
        assert await store.key_states([]) == {} and calls == []
    finally:
        await store.close()
