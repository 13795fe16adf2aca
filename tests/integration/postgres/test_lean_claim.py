"""The lean claim: a store that never used central queues, limit keys, fair share or auctions
claims with a statement without them, and one instance's first use of a feature turns every
other instance's claims to the whole statement before any of them can miss it."""

from __future__ import annotations

import logging

import psycopg
import pytest

from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import ExpertInfo
from contend.store.postgres import PostgresStore
from contend.testing import FakeClock
from tests.integration.postgres.conftest import StoreFactory


async def _features(url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT name FROM contend.features ORDER BY name")
        return [r[0] for r in await cur.fetchall()]


async def test_plain_tasks_leave_the_store_lean(make_store: StoreFactory, pg_url: str) -> None:
    store = await make_store()
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    await store.submit([TaskSpec.build("t", [n]) for n in range(3)])
    got = await store.claim("e", session, ["default"], Capabilities(), limit=2, lease_ttl=60)
    assert len(got) == 2
    assert store._db.lean and await _features(pg_url) == []


async def test_a_limit_submitted_elsewhere_is_kept_by_a_lean_claimer(
    make_store: StoreFactory, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    claimer, submitter = await make_store(), await make_store()
    session = await claimer.register_expert(ExpertInfo("e"), 60.0)
    await claimer.submit([TaskSpec.build("plain", [])])
    assert (
        len(await claimer.claim("e", session, ["default"], Capabilities(), limit=1, lease_ttl=60))
        == 1
    )
    assert claimer._db.lean  # it claimed with the lean statement so far
    # another instance submits two tasks of a key with room for one
    keyed = [TaskSpec.build("k", [n], limit_key="door", concurrency_limit=1) for n in range(2)]
    await submitter.submit(keyed)
    assert await _features(pg_url) == ["limits"]
    with caplog.at_level(logging.INFO, logger="contend.store.postgres"):
        got = await claimer.claim("e", session, ["default"], Capabilities(), limit=5, lease_ttl=60)
    assert [c.id for c in got] == [keyed[0].id]  # the limit holds on the first claim after
    assert not claimer._db.lean
    assert sum("claims take the whole statement" in r.getMessage() for r in caplog.records) == 1


async def test_a_first_bid_elsewhere_holds_a_lean_claimer_to_the_auction(
    make_store: StoreFactory, pg_url: str
) -> None:
    clock = FakeClock(1_000.0)
    claimer = await make_store(clock=clock)
    bidder = await make_store(clock=clock)
    mine = await claimer.register_expert(ExpertInfo("loser"), 60.0)
    theirs = await bidder.register_expert(ExpertInfo("winner"), 60.0)
    warm, lot = TaskSpec.build("t", []), TaskSpec.build("t", [])
    await claimer.submit([warm])
    assert [
        c.id
        for c in await claimer.claim(
            "loser", mine, ["default"], Capabilities(), limit=1, lease_ttl=60
        )
    ] == [warm.id]
    await claimer.submit([lot])
    await bidder.bid("winner", theirs, lot.id, 0.9, 0.5)  # open until 1,000.5
    assert await _features(pg_url) == ["auctions"]
    # the auction is open: nobody claims it, lean statement or not
    assert (
        await claimer.claim("loser", mine, ["default"], Capabilities(), limit=1, lease_ttl=60) == []
    )
    assert not claimer._db.lean
    clock.advance(0.6)  # closed; the loser did not bid, so the winner's grace holds it back
    assert (
        await claimer.claim("loser", mine, ["default"], Capabilities(), limit=1, lease_ttl=60) == []
    )
    got = await bidder.claim("winner", theirs, ["default"], Capabilities(), limit=1, lease_ttl=60)
    assert [c.id for c in got] == [lot.id]


async def test_the_upgrade_marks_the_features_old_tasks_use(
    make_store: StoreFactory, pg_url: str
) -> None:
    store = await make_store()
    await store.submit(
        [TaskSpec.build("f", [], limit_key="tenant:a", fair=True), TaskSpec.build("p", [])]
    )
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        # as a store of version 11 would be: the table did not exist
        await conn.execute("DROP TABLE contend.features")
        await conn.execute("DELETE FROM contend.contend_schema_version WHERE version >= 12")
    assert await PostgresStore(pg_url).migrate() == [12, 13, 14, 15]
    assert await _features(pg_url) == ["fair", "limits"]


async def test_a_claim_whose_lean_answer_came_is_not_made_twice(make_store: StoreFactory) -> None:
    # a concurrent claim of the same instance turns the flag off while this one's lean
    # statement is on its way (here: as its parameters are made); it must not then claim
    # again with the whole statement, taking tasks it never hands back
    store = await make_store()
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    await store.submit([TaskSpec.build("t", [n]) for n in range(2)])
    db = store._db
    make = db.params

    def params(**given: object) -> dict[str, object]:
        db.lean = False
        return make(**given)

    db.params = params  # type: ignore[method-assign]
    got = await store.claim("e", session, ["default"], Capabilities(), limit=1, lease_ttl=60)
    db.params = make  # type: ignore[method-assign]
    assert len(got) == 1
    held = [t for t in await store.list_tasks(limit=10) if t.owner == "e"]
    assert [t.id for t in held] == [got[0].id]
