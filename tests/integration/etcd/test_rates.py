"""The etcd store keeps rate limits and fair share at claim time (rates.py, ``r/`` keys;
fair.py): rival instances never start more of a key than its rate allows, a submission keeps
the key's state, and claims of tasks without a limit key read nothing more."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from contend.domain.limits import Rate
from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.etcd import EtcdStore
from contend.store.etcd.record import Record
from contend.store.etcd.submit import new_record
from contend.store.port import ExpertInfo
from contend.testing import FakeClock

pytestmark = pytest.mark.etcd

ANY = Capabilities()
Q = ["default"]
EVERY = Rate.of((1, 10.0), burst=3)  # a start every 10 s, three back to back


def rated(key: str, n: int, rate: Rate = EVERY, **options: Any) -> TaskSpec:
    return TaskSpec.build("job", [n], limit_key=key, rate_limit=rate, **options)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(store_url: str, clock: FakeClock) -> AsyncIterator[EtcdStore]:
    s = EtcdStore(store_url, clock=clock)
    await s.open()
    yield s
    await s.close()


async def rate_of(store: EtcdStore, key: str) -> dict[str, Any]:
    raw = await store.read_key(store._keys.rate(key))
    assert raw is not None
    parsed: dict[str, Any] = orjson.loads(raw)
    return parsed


def test_a_record_keeps_its_rate_and_fair_flag() -> None:
    spec = TaskSpec.build("job", [], limit_key="k", rate_limit=EVERY, fair=True)
    back = Record.loads(new_record(spec, TaskState.PENDING, None, 0, 1.0).dumps())
    assert back.limit == ["k", None] and back.concurrency_limit is None
    assert back.rate == [10.0, 3] and back.fair is True


async def test_six_instances_racing_start_no_more_than_the_burst(
    store_url: str, clock: FakeClock
) -> None:
    stores = [EtcdStore(store_url, timeout=5.0, clock=clock) for _ in range(6)]
    for s in stores:
        await s.open()
    try:
        await stores[0].submit([rated("k", i) for i in range(30)])
        sessions = [await s.register_expert(ExpertInfo(f"e{n}"), 30) for n, s in enumerate(stores)]

        async def round_() -> int:
            got = await asyncio.gather(
                *(
                    s.claim(f"e{n}", sessions[n], Q, ANY, limit=2, lease_ttl=30)
                    for n, s in enumerate(stores)
                )
            )
            return sum(len(g) for g in got)

        assert await round_() == 3  # the burst, whoever won the races
        assert await round_() == 0
        clock.advance(10.0)
        assert await round_() == 1  # one interval: one start
        clock.advance(25.0)
        assert await round_() == 2  # two and a half intervals: two whole ones
        running = await stores[0].list_tasks(state=TaskState.RUNNING)
        assert len(running) == 6
    finally:
        for s in stores:
            await s.close()


async def test_a_submission_keeps_the_state_of_its_key(store: EtcdStore, clock: FakeClock) -> None:
    await store.submit([rated("k", i) for i in range(3)])
    s = await store.register_expert(ExpertInfo("a"), 30)
    assert len(await store.claim("a", s, Q, ANY, limit=5, lease_ttl=30)) == 3
    tat = (await rate_of(store, "k"))["tat"]
    assert tat == pytest.approx(clock() + 30.0)
    # the same rate again writes nothing; the key stays spent
    revision = (await store._etcd.read_many([store._keys.rate("k")]))[0].mod_revision
    await store.submit([rated("k", i) for i in range(3, 6)])
    assert (await store._etcd.read_many([store._keys.rate("k")]))[0].mod_revision == revision
    assert await store.claim("a", s, Q, ANY, limit=5, lease_ttl=30) == []
    # a new rate is the key's from now on (its state kept): a burst of five has room for two
    await store.submit([rated("k", 9, Rate.of((1, 10.0), burst=5))])
    assert await rate_of(store, "k") == {"interval": 10.0, "burst": 5, "tat": tat}
    assert len(await store.claim("a", s, Q, ANY, limit=5, lease_ttl=30)) == 2


async def test_a_rate_holds_back_the_tasks_of_its_key_without_one(store: EtcdStore) -> None:
    await store.submit([rated("k", 0, Rate.of((1, 10.0)))])
    await store.submit(
        [TaskSpec.build("job", [n], limit_key="k", concurrency_limit=9) for n in range(3)]
    )
    s = await store.register_expert(ExpertInfo("a"), 30)
    assert len(await store.claim("a", s, Q, ANY, limit=5, lease_ttl=30)) == 1


async def test_only_fair_candidates_cost_a_count_read(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[list[bytes]] = []
    counts = store._etcd.counts

    async def counting(prefixes: Any) -> Any:
        if prefixes:
            counted.append(list(prefixes))
        return await counts(prefixes)

    monkeypatch.setattr(store._etcd, "counts", counting)
    await store.submit([TaskSpec.build("job", [n]) for n in range(4)])
    s = await store.register_expert(ExpertInfo("a"), 30)
    assert len(await store.peek(Q, ANY, 4)) == 4
    assert len(await store.claim("a", s, Q, ANY, limit=2, lease_ttl=30)) == 2
    assert counted == []
    fair = [TaskSpec.build("job", [n], limit_key="t:a", fair=True) for n in range(3)]
    await store.submit(fair)
    got = await store.claim("a", s, Q, ANY, limit=3, lease_ttl=30)
    # the two plain tasks left and one of t:a (the plain ones share one turn), one count
    assert len(got) == 3 and store._keys.holders("t:a") in counted[0]


def fair(key: str, n: int) -> TaskSpec:
    return TaskSpec.build("job", [n], limit_key=key, fair=True)


async def test_a_key_behind_a_long_backlog_of_another_gets_its_share(store: EtcdStore) -> None:
    await store.submit([fair("t:a", n) for n in range(300)])  # far more than a level's page
    b = {s.id for s in await store.submit([fair("t:b", n) for n in range(3)])}
    s = await store.register_expert(ExpertInfo("x"), 30)
    got = {c.id for c in await store.claim("x", s, Q, ANY, limit=4, lease_ttl=30)}
    assert len(got & b) == 2, got


async def test_a_claim_reads_at_most_fair_keys_levels_in_turns(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contend.domain.limits import FAIR_KEYS

    keys = [f"t:{n:02d}" for n in range(FAIR_KEYS + 8)]
    await store.submit([fair(k, n) for n, k in enumerate(keys)])
    levels = store._claims.levels
    read, reads = levels.read, []

    async def reading(prefix: bytes, *args: Any, **kw: Any) -> Any:
        reads.append(prefix)
        return await read(prefix, *args, **kw)

    monkeypatch.setattr(levels, "read", reading)
    s = await store.register_expert(ExpertInfo("x"), 30)
    claimed = []
    for _ in range(4):
        reads.clear()
        claimed += await store.claim("x", s, Q, ANY, limit=10, lease_ttl=30)
        assert len(set(reads)) <= FAIR_KEYS
    assert len({c.id for c in claimed}) == len(keys)  # every key had its turn
