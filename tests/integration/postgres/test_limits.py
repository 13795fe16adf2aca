"""Rate limits and fair share on PostgreSQL: a rate kept exactly by claimers racing on several
store instances, and the fair claim's rotation over more keys than it looks at."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from contend.domain.limits import FAIR_KEYS, Rate
from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import ExpertInfo
from contend.store.postgres import PostgresStore, limited
from contend.testing import FakeClock

from .conftest import StoreFactory


async def _race(stores: list[PostgresStore], names: list[str], sessions: list[str]) -> list[str]:
    """Every claimer claims until its claims have come back empty five times in a row; the ids
    claimed, in no order."""
    got: list[str] = []
    start = asyncio.Event()

    async def claimer(store: PostgresStore, name: str, session: str) -> None:
        await start.wait()
        idle = 0
        while idle < 5:
            claimed = await store.claim(
                name, session, ["default"], Capabilities(), limit=3, lease_ttl=3600
            )
            idle = 0 if claimed else idle + 1
            got.extend(c.id for c in claimed)

    workers = [
        asyncio.create_task(claimer(stores[i % len(stores)], name, session))
        for i, (name, session) in enumerate(zip(names, sessions, strict=True))
    ]
    start.set()
    await asyncio.wait_for(asyncio.gather(*workers), 60)
    return got


async def test_racing_claimers_keep_a_rate_exactly(make_store: StoreFactory, pg_url: str) -> None:
    """Six store instances, two claimers each, at one frozen moment: of 30 tasks of a key with
    a burst of 5 exactly 5 start, with every task without a key; a minute later (the rate's
    interval) exactly one more, however the claims interleave."""
    clock = FakeClock(1_000_000.0)
    stores = [await make_store(clock=clock, pool_size=2) for _ in range(6)]
    rate = Rate.of((1, 60.0), burst=5)
    keyed = [TaskSpec.build("t", [n], limit_key="api", rate_limit=rate) for n in range(30)]
    plain = [TaskSpec.build("t", [n]) for n in range(10)]
    await stores[0].submit([*keyed, *plain])
    ids = {s.id for s in keyed}
    names = [f"c{n}" for n in range(12)]
    sessions = [
        await stores[n % 6].register_expert(ExpertInfo(name), 3600) for n, name in enumerate(names)
    ]

    first = await _race(stores, names, sessions)
    assert len(first) == len(set(first))  # no task twice
    assert len(ids & set(first)) == 5 and {s.id for s in plain} <= set(first), first
    clock.advance(60.0)
    second = await _race(stores, names, sessions)
    assert len(second) == 1 and second[0] in ids and second[0] not in first, second
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT tat, full_until FROM contend.rate_keys WHERE key = 'api'")
        # six starts, one interval each, from the first moment on
        assert await cur.fetchall() == [(1_000_000.0 + 6 * 60, 1_000_000.0 + 2 * 60)]


async def test_a_fair_claim_looks_at_fair_keys_a_turn_at_a_time(
    store: PostgresStore, clock: FakeClock
) -> None:
    """With more fair keys than a claim looks at, the first claim sees the first FAIR_KEYS
    keys by name and the next claim the keys after them, round to the first again: the
    oldest head of all (the last key's) waits one turn, no more."""
    n = FAIR_KEYS + 8
    keys = [f"k{i:02}" for i in range(n)]
    # the last key's task is the oldest: a claim that looked at every key would take it first
    subs = {}
    for key in reversed(keys):
        (sub,) = await store.submit([TaskSpec.build("t", [key], limit_key=key, fair=True)])
        subs[key] = sub.id
        clock.advance(1.0)
    session = await store.register_expert(ExpertInfo("e"), 3600)

    async def claim_one() -> str:
        (got,) = await store.claim(
            "e", session, ["default"], Capabilities(), limit=1, lease_ttl=3600
        )
        return got.id

    # first turn: keys k00..k31, whose oldest head is k31's
    assert await claim_one() == subs[keys[FAIR_KEYS - 1]]
    # next turn: k32..k39 and round to k00..: the oldest of all, k39's
    assert await claim_one() == subs[keys[-1]]
    peeked = [v.id for v in await store.peek(["default"], Capabilities(), n)]
    assert len(peeked) == FAIR_KEYS and len(set(peeked)) == FAIR_KEYS
    rest = [await claim_one() for _ in range(n - 2)]  # then every other key's, once each
    assert sorted(rest) == sorted(set(subs.values()) - {subs[keys[-1]], subs[keys[31]]})


async def test_the_low_lane_goes_first_in_a_fair_claim(store: PostgresStore) -> None:
    """A fair claim with a low lane: the lane's pick (the old task below the top priority)
    first, then the fair share of the urgent keys; peek shows the same."""
    (old,) = await store.submit([TaskSpec.build("t", ["old"], priority=0)])
    a = await store.submit(
        [TaskSpec.build("t", [n], priority=5, limit_key="a", fair=True) for n in range(6)]
    )
    b = await store.submit(
        [TaskSpec.build("t", [n], priority=5, limit_key="b", fair=True) for n in range(2)]
    )
    session = await store.register_expert(ExpertInfo("e"), 3600)
    seen = [v.id for v in await store.peek(["default"], Capabilities(), 3, low_lane=1)]
    assert seen == [old.id, a[0].id, b[0].id], seen
    got = await store.claim(
        "e", session, ["default"], Capabilities(), limit=3, lease_ttl=3600, low_lane=1
    )
    assert {c.id for c in got} == set(seen)  # handed over best first, as every claim
    # named: only those, fair among them
    named = [a[1].id, a[2].id, b[1].id]
    got = await store.claim(
        "e", session, ["default"], Capabilities(), limit=2, lease_ttl=3600, task_ids=named
    )
    assert {c.id for c in got} == {a[1].id, b[1].id}


async def test_a_rate_limited_claim_is_recorded_when_its_rate_was_spent(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim spends a key's rate at the time it reads the key's state, then takes the
    # tasks; its history line bore the take's own time. A transaction slow in between
    # (a loaded machine) recorded two starts closer than the rate allows (45 ms apart at
    # 20/s, in a CI run).
    store = await make_store()
    every = Rate.of((1, 0.2))
    await store.submit([TaskSpec.build("t", [n], limit_key="k", rate_limit=every) for n in "ab"])
    session = await store.register_expert(ExpertInfo("e"), 60)
    real = limited.spend_params
    calls = []

    def slow(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the first claim is held up after the rate was read
            time.sleep(0.1)
        return real(*args)

    monkeypatch.setattr(limited, "spend_params", slow)
    claims = []
    while len(claims) < 2:
        got = await store.claim("e", session, ["default"], Capabilities(), limit=1, lease_ttl=60)
        claims += got
        if not got:
            await store.wait_for_change(0.01)
    at = []
    for c in claims:
        task = await store.get(c.id, history=True)
        at += [e.at for e in task.history if e.event in ("claimed", "started")][:1]
    assert at[1] - at[0] >= 0.2 - 1e-6, at
