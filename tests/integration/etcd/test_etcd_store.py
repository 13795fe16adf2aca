"""The etcd store against a real etcd started by the suite (see conftest.py).

etcd leases run on etcd's own clock, so tests that need a lease to lapse use a one-second TTL
and poll ``expire()`` with a deadline instead of advancing a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from aetcd import rpc

from contend.domain.retry import RetryPolicy
from contend.domain.task import LANE_LEVELS, Capabilities, TaskSpec, TaskState
from contend.errors import (
    ConfigError,
    DependencyError,
    ExpertConflict,
    FencedOut,
    InvalidTransition,
    LeaseLost,
    SchemaError,
    StoreError,
)
from contend.store.etcd import DELETE, GET, LEVEL_SWEEP, PUT, EtcdStore, parse_etcd_url
from contend.store.port import Claimed, Completion, ExpertInfo, Failure, Heartbeat, Outrun
from contend.store.registry import make_store
from contend.testing import FakeClock
from contend.testing.etcd_server import EtcdServer, lapse_overdue_sessions

pytestmark = pytest.mark.etcd

ANY = Capabilities()
Q = ["default"]


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 10.0, what: str = "condition"
) -> None:
    """Poll *check* until it is true; fail after *within* seconds."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {within}s")
        await asyncio.sleep(0.05)


async def expire_until(store: EtcdStore, count: int, within: float = 10.0) -> None:
    moved = 0

    async def check() -> bool:
        nonlocal moved
        moved += await store.expire()
        return moved >= count

    await eventually(check, within, f"{count} task(s) expired")


@contextlib.asynccontextmanager
async def open_stores(
    url: str, n: int, clocks: Sequence[Callable[[], float]] = ()
) -> AsyncIterator[list[EtcdStore]]:
    """*n* store instances on one prefix, as separate processes would have: opened, then closed.
    *clocks*, if given, are their hosts' clocks, one each."""
    stores = [EtcdStore(url, clock=clocks[i]) if clocks else EtcdStore(url) for i in range(n)]
    try:
        for s in stores:
            await s.open()
        yield stores
    finally:
        for s in stores:
            await s.close()


def spec(**kw: object) -> TaskSpec:
    return TaskSpec.build("work", [1], **kw)  # type: ignore[arg-type]


def _rec(value: bytes) -> Any:
    from contend.store.etcd import _Rec

    return _Rec.loads(value)


# -- URL and registry -------------------------------------------------------------------------
def test_url_parsing() -> None:
    assert parse_etcd_url("etcd://h:1234") == ("h", 1234, "contend/")
    assert parse_etcd_url("etcd://h/app/one") == ("h", 2379, "app/one/")
    assert parse_etcd_url("etcd://[::1]:2380/x") == ("::1", 2380, "x/")
    for bad in ("etcd://", "etcd://h:99999", "etcd://h:1/a//b", "redis://h", "etcd://u:p@h"):
        with pytest.raises(ConfigError):
            parse_etcd_url(bad)


def test_url_options() -> None:
    store = EtcdStore("etcd://h:1/app?max_txn_ops=1024&timeout=2.5")
    assert (store.options.max_txn_ops, store.options.timeout, store.options.prefix) == (
        1024,
        2.5,
        b"app/",
    )
    assert EtcdStore("etcd://h:1", max_txn_ops=512).options.max_txn_ops == 512
    assert EtcdStore("etcd://h:1").options.compact_after == 60.0
    assert EtcdStore("etcd://h:1?compact_after=0").options.compact_after == 0.0
    assert EtcdStore("etcd://h:1?max_txn_ops=512", max_txn_ops=512).options.max_txn_ops == 512
    for url, message in [
        ("etcd://h:1?x=1", "unknown option 'x'"),
        ("etcd://h:1?max_txn_ops=lots", "is not a number"),
        ("etcd://h:1?max_txn_ops=8", "max_txn_ops must be an integer >= 16"),
        ("etcd://h:1?timeout=0", "timeout must be a positive number"),
        ("etcd://h:1?compact_after=-1", "compact_after must be a number of seconds >= 0"),
        ("etcd://h:1?compact_after=nan", "compact_after must be a number of seconds >= 0"),
        ("etcd://h:1?timeout=1&timeout=2", "given twice"),
        ("etcd://h:1?timeout", "malformed options"),
    ]:
        with pytest.raises(ConfigError, match=message):
            EtcdStore(url)
    with pytest.raises(ConfigError, match="in the URL but 256 as an argument"):
        EtcdStore("etcd://h:1?max_txn_ops=512", max_txn_ops=256)


def test_registry_builds_an_etcd_store() -> None:
    store = make_store("etcd://127.0.0.1:2379/x")
    assert isinstance(store, EtcdStore)


async def test_unreachable_server_is_a_clear_store_error() -> None:
    store = EtcdStore("etcd://127.0.0.1:1/x", timeout=1.0)
    with pytest.raises(StoreError, match=r"127\.0\.0\.1:1\b"):
        await store.open()


async def test_foreign_prefix_is_refused(etcd_server: EtcdServer) -> None:
    prefix = f"foreign-{uuid.uuid4().hex[:8]}"
    plain = EtcdStore(f"{etcd_server.url}/{prefix}")
    await plain.open()
    # Write a key under the prefix that is not contend's, on a prefix without a meta key.
    other = EtcdStore(f"{etcd_server.url}/{prefix}-x")
    await other.open()
    await other._etcd.txn([], [_raw_put(f"{prefix}2/alien", "x")])
    await other.close()
    await plain.close()
    with pytest.raises(SchemaError, match="not a contend store"):
        await EtcdStore(f"{etcd_server.url}/{prefix}2").open()


async def test_many_processes_open_a_new_prefix_at_once(store_url: str) -> None:
    stores = [EtcdStore(store_url) for _ in range(8)]

    async def open_and_write(s: EtcdStore) -> None:
        await s.open()
        await s.submit([spec()])

    try:
        await asyncio.gather(*(open_and_write(s) for s in stores))
        assert len(await stores[0].list_tasks()) == 8
    finally:
        for s in stores:
            await s.close()


def _raw_put(key: str, value: str) -> tuple[object, ...]:
    from contend.store.etcd import _put

    return _put(key.encode(), value)


# -- submission --------------------------------------------------------------------------------
async def test_submit_orders_by_priority_then_fifo(store: EtcdStore) -> None:
    low1, high, low2 = spec(), spec(priority=5), spec()
    await store.submit([low1])
    await store.submit([high])
    await store.submit([low2])
    views = await store.peek(Q, ANY, 10)
    assert [v.id for v in views] == [high.id, low1.id, low2.id]
    assert views[0].priority == 5


async def test_idempotency_key_returns_the_first_task(store: EtcdStore) -> None:
    a, b = spec(key="k1"), spec(key="k1")
    (first,) = await store.submit([a])
    second, third = await store.submit([b, spec(key="k1")])
    assert first.created and not second.created and not third.created
    assert second.id == third.id == a.id
    assert len(await store.list_tasks()) == 1


async def test_a_new_task_is_one_round_trip_and_a_resend_still_finds_the_first(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A submit read every spec's id and key before its transaction: two round trips for a
    # plain one (1.9 ms against 1.5). The transaction's compares are the check now, and a
    # resend or a taken key falls back on the read.
    calls: list[str] = []
    etcd = store._etcd
    call = etcd.call

    async def counted(what: str, make: Callable[[], Awaitable[Any]]) -> Any:
        calls.append(what)
        return await call(what, make)

    monkeypatch.setattr(etcd, "call", counted)
    a, keyed = spec(), spec(key="once")
    assert [s.created for s in await store.submit([a, keyed])] == [True, True]
    assert calls == ["a transaction"]
    again = await store.submit([a, spec(key="once"), spec()])
    assert [(s.id, s.created) for s in again[:2]] == [(a.id, False), (keyed.id, False)]
    assert again[2].created
    assert len(await store.list_tasks()) == 3
    assert (await store.get(a.id)).attempts == 0


async def test_big_batch_is_split_into_transactions(store_url: str) -> None:
    store = EtcdStore(store_url, max_txn_ops=16)
    await store.open()
    try:
        specs = [spec(key=f"k{i}") for i in range(60)]
        out = await store.submit(specs)
        assert all(s.created for s in out)
        assert len(await store.list_tasks(limit=1000)) == 60
        again = await store.submit(specs)
        assert not any(s.created for s in again)
    finally:
        await store.close()


async def test_small_payloads_ride_in_the_record_and_big_ones_in_keys_of_their_own(
    store: EtcdStore,
) -> None:
    big = "x" * 5_000  # more than INLINE_MAX
    small, large = TaskSpec.build("work", ["s"]), TaskSpec.build("work", [big], {"k": big})
    await store.submit([small, large])
    s = await store.register_expert(ExpertInfo("e"), 10)
    got = {c.id: c for c in await store.claim("e", s, Q, ANY, limit=2, lease_ttl=10)}
    assert got[small.id].args == ["s"]
    assert got[large.id].args == [big] and got[large.id].kwargs == {"k": big}
    await store.checkpoint("e", large.id, got[large.id].fence, json.dumps({"at": big}))
    results = [json.dumps("done"), json.dumps([big, 1])]
    assert await store.complete(
        "e",
        [
            Completion(t.id, got[t.id].fence, r)
            for t, r in zip([small, large], results, strict=True)
        ],
    ) == [None, None]
    for t, r in zip([small, large], results, strict=True):
        task = await store.get(t.id)
        assert task.state == TaskState.SUCCEEDED and task.result == json.loads(r)
    listed = {t.id: t for t in await store.list_tasks()}
    assert listed[large.id].result == [big, 1] and listed[large.id].args == [big]
    assert listed[large.id].checkpoint == {"at": big} and listed[small.id].checkpoint is None
    # a checkpoint survives a lapsed claim: the next owner resumes from it
    again = TaskSpec.build("work", [])
    await store.submit([again])
    s1 = await store.register_expert(ExpertInfo("e1"), 1)
    (c,) = await store.claim("e1", s1, Q, ANY, limit=1, lease_ttl=1)
    await store.checkpoint("e1", again.id, c.fence, json.dumps(7))
    await expire_until(store, 1)
    (c2,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
    assert c2.id == again.id and c2.checkpoint == 7


async def test_requirements_and_delay_filter_claimable(store: EtcdStore) -> None:
    gpu = spec(requirements=["gpu"])
    later = spec(delay=3600)
    await store.submit([gpu, later])
    assert await store.peek(Q, ANY, 10) == []
    assert [v.id for v in await store.peek(Q, Capabilities(frozenset({"gpu"})), 10)] == [gpu.id]
    due = await store.next_due(Q)  # the gpu task is due now, the other in an hour
    assert due is not None and due <= await store.now()
    assert (await store.get(later.id)).run_at > due + 3000


# -- claim exclusivity -------------------------------------------------------------------------
async def test_many_claimers_claim_each_task_once(store_url: str) -> None:
    tasks = 60
    claimers = 8
    setup = EtcdStore(store_url)
    await setup.open()
    await setup.submit([spec() for _ in range(tasks)])
    stores = [EtcdStore(store_url) for _ in range(claimers)]
    for s in stores:
        await s.open()
    won: dict[str, list[tuple[str, int]]] = {}

    async def claimer(n: int, store: EtcdStore) -> None:
        name = f"e{n}"
        session = await store.register_expert(ExpertInfo(name), 10)
        while True:
            got = await store.claim(name, session, Q, ANY, limit=1, lease_ttl=10)
            if not got:
                if not await store.peek(Q, ANY, 1):
                    return
                continue
            for c in got:
                won.setdefault(c.id, []).append((name, c.fence))

    try:
        await asyncio.wait_for(asyncio.gather(*(claimer(n, s) for n, s in enumerate(stores))), 60)
        assert len(won) == tasks
        assert all(len(v) == 1 and v[0][1] == 1 for v in won.values()), won
        stats = await setup.stats()
        assert stats.counts["default"] == {"running": tasks}
        assert len({v[0][0] for v in won.values()}) > 1  # the work was shared
    finally:
        for s in [setup, *stores]:
            await s.close()


async def test_claim_named_tasks_only(store: EtcdStore) -> None:
    a, b = spec(), spec()
    await store.submit([a, b])
    session = await store.register_expert(ExpertInfo("e"), 5)
    got = await store.claim("e", session, Q, ANY, limit=5, lease_ttl=5, task_ids=[b.id])
    assert [c.id for c in got] == [b.id]


async def test_claim_without_live_session_raises_lease_lost(store: EtcdStore) -> None:
    await store.submit([spec()])
    with pytest.raises(LeaseLost):
        await store.claim("ghost", "nope", Q, ANY, limit=1, lease_ttl=5)


# -- fencing -----------------------------------------------------------------------------------
async def test_stale_owner_is_fenced_out(store_url: str) -> None:
    async with open_stores(store_url, 2) as (a_store, b_store):
        t = spec()
        await a_store.submit([t])
        a = await a_store.register_expert(ExpertInfo("a"), 1)
        (mine,) = await a_store.claim("a", a, Q, ANY, limit=1, lease_ttl=1)
        await a_store.checkpoint("a", t.id, mine.fence, json.dumps({"step": 1}))
        # "a" stalls: no renewal; etcd ends its lease, the task goes back to pending.
        await expire_until(b_store, 1)
        b = await b_store.register_expert(ExpertInfo("b"), 10)
        (theirs,) = await b_store.claim("b", b, Q, ANY, limit=1, lease_ttl=10)
        assert theirs.fence == mine.fence + 1
        assert theirs.checkpoint == {"step": 1}
        assert theirs.attempt == 2
        (refused,) = await a_store.complete("a", [Completion(t.id, mine.fence, '"stale"')])
        assert isinstance(refused, FencedOut)
        with pytest.raises(FencedOut):
            await a_store.checkpoint("a", t.id, mine.fence, "{}")
        with pytest.raises(LeaseLost):
            await a_store.renew("a", a, 1, Heartbeat())
        assert await b_store.complete("b", [Completion(t.id, theirs.fence, '"fresh"')]) == [None]
        done = await b_store.get(t.id, history=True)
        assert done.state == TaskState.SUCCEEDED and done.result == "fresh"
        assert [e.event for e in done.history] == ["claimed", "expired", "claimed", "succeeded"]
        # A second commit by the rightful owner does not land twice.
        (again,) = await b_store.complete("b", [Completion(t.id, theirs.fence, '"twice"')])
        assert isinstance(again, FencedOut)
        assert (await b_store.get(t.id)).result == "fresh"


async def test_cancel_fences_out_the_owner(store: EtcdStore) -> None:
    t = spec()
    await store.submit([t])
    s = await store.register_expert(ExpertInfo("e"), 5)
    (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=5)
    assert (await store.cancel(t.id)).state == TaskState.CANCELLED
    (res,) = await store.complete("e", [Completion(t.id, c.fence, "1")])
    assert isinstance(res, FencedOut)
    assert await store.renew("e", s, 5, Heartbeat()) == {}
    with pytest.raises(InvalidTransition):
        await store.cancel(t.id)
    retried = await store.retry(t.id)
    assert retried.state == TaskState.PENDING and retried.attempts == 0


# -- leases ------------------------------------------------------------------------------------
async def test_lease_expiry_returns_task_then_kills_it(store: EtcdStore) -> None:
    t = spec(max_attempts=2)
    await store.submit([t])
    for attempt in (1, 2):
        s = await store.register_expert(ExpertInfo(f"e{attempt}"), 1)
        (c,) = await store.claim(f"e{attempt}", s, Q, ANY, limit=1, lease_ttl=1)
        assert c.attempt == attempt
        await store.checkpoint(f"e{attempt}", t.id, c.fence, json.dumps(attempt))
        await expire_until(store, 1)
    dead = await store.get(t.id)
    assert dead.state == TaskState.DEAD
    assert dead.error["type"] == "LeaseExpired"
    assert dead.checkpoint == 2
    assert dead.owner is None


async def test_renew_keeps_claims_alive(store: EtcdStore) -> None:
    t = spec()
    await store.submit([t])
    s = await store.register_expert(ExpertInfo("e"), 1)
    (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=1)
    start = time.monotonic()
    while time.monotonic() - start < 2.5:  # well past the one-second TTL
        assert await store.renew("e", s, 1, Heartbeat(load=1)) == {t.id: c.fence}
        assert await store.expire() == 0
        await asyncio.sleep(0.25)  # the heartbeat period, not a wait for some event
    assert await store.complete("e", [Completion(t.id, c.fence, "1")]) == [None]
    (rec,) = await store.list_experts()
    assert rec.alive and rec.load == 1


async def test_a_cut_keepalive_stream_is_reopened_and_a_lapsed_lease_is_lost(
    store_url: str,
) -> None:
    """The long-lived LeaseKeepAlive stream breaks (cancelled under the store, as a cut
    connection ends it): the next renewal opens a new stream and the claims live on. Cut while
    the lease lapses, the new stream answers TTL 0: the renewal raises LeaseLost, the session's
    claims are gone, and its tasks go back to pending."""
    async with open_stores(store_url, 2) as (store, other):
        t = spec()
        await store.submit([t])
        s = await store.register_expert(ExpertInfo("e"), 1)
        (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=1)
        assert await store.renew("e", s, 1, Heartbeat()) == {t.id: c.fence}
        (ka,) = store._sessions.keepalives.values()
        first = ka._call
        first.cancel()  # the stream ends under the store
        assert await store.renew("e", s, 1, Heartbeat()) == {t.id: c.fence}
        assert ka._call is not first and await store.expire() == 0
        ka._call.cancel()  # cut again, and no renewal until the lease has lapsed
        await expire_until(other, 1)
        with pytest.raises(LeaseLost, match="expired"):
            await store.renew("e", s, 1, Heartbeat())
        assert (await store.get(t.id)).state == TaskState.PENDING
        (refused,) = await store.complete("e", [Completion(t.id, c.fence, "1")])
        assert isinstance(refused, FencedOut)


async def test_expire_and_renew_read_no_ownership_keys_while_every_session_lives(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range read walks every key deleted since the last compaction: expire() reads the
    sessions (x/, l/) and the claims of ended sessions only, renew() the records of the
    tasks this instance claimed, never the a/ prefix."""
    async with open_stores(store_url, 2) as (store, other):
        await store.submit([spec() for _ in range(6)])
        s = await store.register_expert(ExpertInfo("e"), 2)
        done = await store.claim("e", s, Q, ANY, limit=4, lease_ttl=2)
        assert (
            await store.complete("e", [Completion(c.id, c.fence, "1") for c in done]) == [None] * 4
        )
        kept = await store.claim("e", s, Q, ANY, limit=2, lease_ttl=2)
        ranges: list[bytes] = []
        real_range, real_txn = store._etcd.range, store._etcd.txn

        async def range_(key: bytes, end: bytes | None = None, **kw: Any) -> Any:
            if end:
                ranges.append(key)
            return await real_range(key, end, **kw)

        async def txn(cmp: Any, ops: Any, failure: Any = ()) -> Any:
            ranges.extend(op[1] for op in [*ops, *failure] if op[0] == GET and op[2])
            return await real_txn(cmp, ops, failure)

        monkeypatch.setattr(store._etcd, "range", range_)
        monkeypatch.setattr(store._etcd, "txn", txn)
        assert await store.expire() == 0
        assert await store.renew("e", s, 2, Heartbeat()) == {c.id: c.fence for c in kept}
        claim_keys = (store._keys.k("a", ""),)
        assert ranges and not [k for k in ranges if k.startswith(claim_keys)], ranges
        assert await other.revoke_lease("e")  # the session ends: its claims are read, once
        assert await store.expire() == 2
        assert [k for k in ranges if k.startswith(claim_keys)] == [store._keys.k("a", "e", "")]
        assert {(await store.get(c.id)).state for c in kept} == {TaskState.PENDING}
        ranges.clear()
        assert await store.expire() == 0  # the ended session was forgotten
        assert not [k for k in ranges if k.startswith(claim_keys)]


async def test_a_restarted_expert_does_not_hold_its_former_session_s_claims(
    store: EtcdStore,
) -> None:
    a, b = spec(), spec()
    await store.submit([a, b])
    s1 = await store.register_expert(ExpertInfo("e"), 5)
    (old,) = await store.claim("e", s1, Q, ANY, limit=1, lease_ttl=5)
    await store.deregister_expert("e", s1)  # its claim vanishes with the lease; expire() has
    s2 = await store.register_expert(ExpertInfo("e"), 5)  # not run yet when it comes back
    (new,) = await store.claim("e", s2, Q, ANY, limit=1, lease_ttl=5)
    assert new.id != old.id
    assert await store.renew("e", s2, 5, Heartbeat()) == {new.id: new.fence}
    assert await store.expire() == 1
    assert (await store.get(old.id)).state == TaskState.PENDING
    assert await store.renew("e", s2, 5, Heartbeat()) == {new.id: new.fence}


async def test_release_gives_the_attempt_back(store: EtcdStore) -> None:
    t = spec()
    await store.submit([t])
    s = await store.register_expert(ExpertInfo("e"), 5)
    (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=5, start=False)
    assert (await store.get(t.id)).state == TaskState.CLAIMED
    assert await store.start("e", [(t.id, c.fence)]) == [None]
    assert await store.release("e", [(t.id, c.fence)]) == [None]
    back = await store.get(t.id)
    assert back.state == TaskState.PENDING and back.attempts == 0 and back.fence == 1


async def test_fail_retries_then_goes_final(store: EtcdStore) -> None:
    """The owner's retry policy decides from the attempt its claim reported; the store applies
    the decision (a retry delay on the last attempt would be retried: the store no longer
    second-guesses it)."""
    t = spec(max_attempts=2)
    await store.submit([t])
    s = await store.register_expert(ExpertInfo("e"), 5)
    err = json.dumps({"type": "ValueError", "message": "boom"})
    policy = RetryPolicy(backoff=0)

    async def claim_and_fail() -> None:
        (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=5)
        decision = policy.decide(c.attempt, None, max_attempts=c.max_attempts)
        delay = decision.delay if decision.retry else None
        failure = Failure(t.id, c.fence, err, delay, TaskState(decision.final_state))
        assert await store.fail("e", [failure]) == [None]

    await claim_and_fail()
    assert (await store.get(t.id)).state == TaskState.PENDING
    await claim_and_fail()
    final = await store.get(t.id)
    assert final.state == TaskState.DEAD and final.error["message"] == "boom"


async def test_expert_sessions(store: EtcdStore) -> None:
    s = await store.register_expert(ExpertInfo("e", host="h1", pid=7), 5)
    with pytest.raises(ExpertConflict, match="h1"):
        await store.register_expert(ExpertInfo("e"), 5)
    await store.deregister_expert("e", s)
    (rec,) = await store.list_experts()
    assert not rec.alive
    with pytest.raises(LeaseLost):
        await store.renew("e", s, 5, Heartbeat())
    s2 = await store.register_expert(ExpertInfo("e"), 5)
    assert s2 != s


# -- dependencies ------------------------------------------------------------------------------
async def test_dependencies_release_waiters(store: EtcdStore) -> None:
    a = spec()
    b = spec(depends_on=[a.id])
    await store.submit([a, b])
    c = spec(depends_on=[a.id, b.id])
    await store.submit([c])
    assert (await store.get(b.id)).state == TaskState.WAITING
    s = await store.register_expert(ExpertInfo("e"), 5)
    for expected in (a, b, c):
        (got,) = await store.claim("e", s, Q, ANY, limit=5, lease_ttl=5)
        assert got.id == expected.id
        assert await store.complete("e", [Completion(got.id, got.fence, "1")]) == [None]
    assert {t.state for t in await store.list_tasks()} == {TaskState.SUCCEEDED}


async def test_failed_dependency_kills_waiters_and_cycles_are_refused(store: EtcdStore) -> None:
    a = spec(max_attempts=1)
    b = spec(depends_on=[a.id])
    c = spec(depends_on=[b.id])
    await store.submit([a, b, c])
    s = await store.register_expert(ExpertInfo("e"), 5)
    (got,) = await store.claim("e", s, Q, ANY, limit=5, lease_ttl=5)
    await store.fail("e", [Failure(a.id, got.fence, '{"type": "X"}', None)])
    assert (await store.get(b.id)).state == TaskState.DEAD
    assert (await store.get(c.id)).error["type"] == "DependencyFailed"
    x = TaskSpec.build("w")
    y = TaskSpec.build("w", depends_on=[x.id])
    cyclic = dataclasses.replace(x, depends_on=(y.id,))
    before = len(await store.list_tasks())
    with pytest.raises(DependencyError, match="cycle"):
        await store.submit([cyclic, y])
    with pytest.raises(DependencyError, match="unknown"):
        await store.submit([spec(depends_on=["nope"])])
    assert len(await store.list_tasks()) == before


# -- wake-ups ----------------------------------------------------------------------------------
async def test_watch_wakes_a_waiting_expert(store_url: str) -> None:
    async with open_stores(store_url, 2) as (waiter, writer):
        # The first call starts the watch, from the last revision this client saw: nothing
        # written after that point can be missed, even before the watch exists.
        await waiter.wait_for_change(0)
        started = time.monotonic()
        waiting = asyncio.create_task(waiter.wait_for_change(30))
        await asyncio.sleep(0.2)  # let the waiter block before the write
        assert not waiting.done()
        await writer.submit([spec()])
        await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - started < 5
        # And with nothing happening it returns after its timeout.
        started = time.monotonic()
        await waiter.wait_for_change(0.3)
        assert 0.25 <= time.monotonic() - started < 3


async def test_compacted_history_keeps_the_store_and_its_watch_working(store_url: str) -> None:
    async with open_stores(store_url, 2) as (waiter, writer):
        first = spec()
        await writer.submit([first])
        await waiter.wait_for_change(0)  # the watch starts at the waiter's last revision
        for _ in range(20):  # history the compaction drops
            await writer.submit([spec()])
        rev = await writer.compact_history()
        assert rev > 0 and await writer.compact_history() >= rev  # twice is harmless
        waiting = asyncio.create_task(waiter.wait_for_change(30))
        await writer.submit([spec()])
        await asyncio.wait_for(waiting, 10)
        assert (await waiter.get(first.id)).state == TaskState.PENDING
        session = await waiter.register_expert(ExpertInfo("e"), 10)
        got = await waiter.claim("e", session, Q, ANY, limit=50, lease_ttl=10)
        assert len(got) == 22


async def test_a_write_before_the_watch_started_is_not_missed(store_url: str) -> None:
    async with open_stores(store_url, 2) as (waiter, writer):
        assert await waiter.peek(Q, ANY, 10) == []  # the waiter has looked: nothing to do
        await writer.submit([spec()])  # then work arrives, before it waits for the first time
        started = time.monotonic()
        await waiter.wait_for_change(30)
        assert time.monotonic() - started < 5


# -- restarts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_etcd_restart_mid_run(fresh_server: EtcdServer, how: str) -> None:
    """etcd goes away (a clean stop, or kill -9) and comes back on the same data."""
    store = EtcdStore(f"{fresh_server.url}/restart", timeout=2.0)
    await store.open()
    try:
        t1, t2 = spec(), spec()
        await store.submit([t1, t2])
        s = await store.register_expert(ExpertInfo("e"), 10)
        (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
        await store.wait_for_change(0)  # start the watch before the outage

        if how == "stop":
            fresh_server.stop()
        else:
            fresh_server.kill()
        with pytest.raises(StoreError, match="etcd"):
            await store.submit([spec()])
        with pytest.raises(StoreError):
            await store.renew("e", s, 10, Heartbeat())
        fresh_server.start()

        async def renewed() -> bool:
            try:
                return await store.renew("e", s, 10, Heartbeat()) == {c.id: c.fence}
            except StoreError:
                return False

        await eventually(renewed, 15, "renewal after the restart")
        assert await store.complete("e", [Completion(c.id, c.fence, "1")]) == [None]
        (c2,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
        assert {c.id, c2.id} == {t1.id, t2.id}
        # The watch came back too: a write by another client wakes this one.
        other = EtcdStore(f"{fresh_server.url}/restart")
        await other.open()
        await store.wait_for_change(0)
        waiting = asyncio.create_task(store.wait_for_change(30))
        await other.submit([spec()])
        await asyncio.wait_for(waiting, 10)
        await other.close()
    finally:
        await store.close()


# -- a fake clock ------------------------------------------------------------------------------
async def test_fake_clock_lapses_sessions_through_the_helper(store_url: str) -> None:
    clock = FakeClock()
    store = EtcdStore(store_url, clock=clock)
    await store.open()
    try:
        t = spec()
        await store.submit([t])
        s = await store.register_expert(ExpertInfo("e"), 10)
        (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=10)
        assert (await store.get(t.id)).lease_deadline == clock() + 10
        clock.advance(10)
        assert await lapse_overdue_sessions(store, clock()) == 0  # due, not overdue
        clock.advance(0.5)
        assert await lapse_overdue_sessions(store, clock()) == 1
        assert await store.expire() == 1
        (res,) = await store.complete("e", [Completion(t.id, c.fence, "1")])
        assert isinstance(res, FencedOut)
    finally:
        await store.close()


async def levels(store: EtcdStore) -> list[str]:
    """The priority levels v/ lists for the default queue."""
    return [inv for inv, _, _ in await store._levels.of_queue("default")]


async def test_levels_are_listed_while_they_hold_tasks_and_ageing_needs_no_writes(
    store_url: str,
) -> None:
    """Claims read the head of each priority level that v/ lists; a waiting task ages by
    the claim's reckoning, without any write; expire() drops levels left empty."""
    clock = FakeClock()
    store = EtcdStore(store_url, clock=clock)
    await store.open()
    try:
        old = spec(priority=0)
        await store.submit([old])
        clock.advance(20.0)  # e³ - 1 ≈ 19.1 s: a priority-0 task has aged to 3
        fresh, urgent = spec(priority=2), spec(priority=5)
        await store.submit([fresh, urgent, spec(priority=2)])  # one level key for the two
        await store.expire()  # housekeeping: no level is empty, and no task needs a write
        assert await levels(store) == ["09999995", "09999998", "10000000"]
        assert (await store._etcd.read_many([store._keys.task(old.id)]))[0].version == 1
        s = await store.register_expert(ExpertInfo("e"), 600)
        got = await store.claim("e", s, Q, ANY, limit=3, lease_ttl=600)
        assert [c.id for c in got] == [urgent.id, old.id, fresh.id]
        clock.advance(LEVEL_SWEEP)
        await store.expire()  # one priority-2 task is left
        assert await levels(store) == ["09999998"]
        late = spec(priority=9)  # the priority-2 task left has aged to 6 meanwhile
        await store.submit([late])
        assert await levels(store) == ["09999991", "09999998"]
        (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=600)
        assert c.id == late.id
        clock.advance(LEVEL_SWEEP / 2)
        await store.expire()  # not yet: once a LEVEL_SWEEP
        assert await levels(store) == ["09999991", "09999998"]
        clock.advance(LEVEL_SWEEP / 2)
        await store.expire()
        assert await levels(store) == ["09999998"]
    finally:
        await store.close()


async def test_a_level_swept_while_a_task_enters_it_stays_listed(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep reads a level empty, a task enters the level, then the sweep deletes: the
    delete compares the level key's revision, which the entering task moved, and fails."""
    clock = FakeClock()
    store, other = EtcdStore(store_url, clock=clock), EtcdStore(store_url, clock=clock)
    await store.open()
    await other.open()
    try:
        await store.submit([spec(priority=4)])
        s = await store.register_expert(ExpertInfo("e"), 600)
        assert len(await store.claim("e", s, Q, ANY, limit=1, lease_ttl=600)) == 1
        late = spec(priority=4)  # level 4 is empty now, and this task is about to enter it
        real_txn = store._etcd.txn

        async def txn_after_a_submission(cmp: Any, ops: Any, failure: Any = ()) -> Any:
            if ops and ops[0][0] == DELETE and ops[0][1].startswith(store._keys.k("v", "")):
                await other.submit([late])  # between the sweep's read and its delete
            return await real_txn(cmp, ops, failure)

        monkeypatch.setattr(store._etcd, "txn", txn_after_a_submission)
        await store.expire()
        monkeypatch.undo()
        assert await levels(store) == ["09999996"]
        (got,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=600)
        assert got.id == late.id
    finally:
        await other.close()
        await store.close()


async def test_claims_raise_the_floor_so_later_reads_skip_what_was_claimed(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd keeps a deleted key in its index until the history is compacted, and a range read
    walks it: a claim raises the level's floor past the tasks it took, and the next read
    starts there instead of at the beginning of the level."""
    tasks = [spec() for _ in range(30)]
    await store.submit(tasks)
    session = await store.register_expert(ExpertInfo("e"), 30)
    got = await store.claim("e", session, Q, ANY, limit=10, lease_ttl=30)
    assert [c.id for c in got] == [t.id for t in tasks[:10]]
    ((_, floor, _),) = await store._levels.of_queue("default")
    head = (await store._etcd.read_many([store._keys.task(tasks[10].id)]))[0]
    assert floor == store._keys.spot(_rec(head.value)).encode()  # the first task left
    starts: list[bytes] = []
    real_range = store._etcd.range

    async def recording(key: bytes, end: bytes | None = None, **kw: object) -> object:
        if key.startswith(store._keys.k("q", "")):
            starts.append(key)
        return await real_range(key, end, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store._etcd, "range", recording)
    got = await store.claim("e", session, Q, ANY, limit=5, lease_ttl=30)
    assert [c.id for c in got] == [t.id for t in tasks[10:15]]
    assert starts and min(starts) == store._keys.k("q", "default", "10000000", floor.decode())


async def test_a_task_entering_below_the_floor_is_claimed_first(store_url: str) -> None:
    """A task that enters a level below its floor (released, or due earlier by another
    host's clock) brings the floor down, though another instance raised it and remembers it."""
    behind = FakeClock(1_600_000_000.0)  # the other host's clock is years behind
    async with open_stores(store_url, 2, [FakeClock(), behind]) as (store, other):
        tasks = [spec() for _ in range(10)]
        await store.submit(tasks)
        s = await store.register_expert(ExpertInfo("e"), 600)
        got = await store.claim("e", s, Q, ANY, limit=3, lease_ttl=600)
        assert [c.id for c in got] == [t.id for t in tasks[:3]]
        assert await other.release("e", [(got[1].id, got[1].fence)]) == [None]
        (again,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=600)
        assert again.id == got[1].id  # released: back at its place, the first of the level
        sooner = spec()  # due in 2020 by the other host's clock: before every task here
        await other.submit([sooner])
        first, second = await store.claim("e", s, Q, ANY, limit=2, lease_ttl=600)
        assert (first.id, second.id) == (sooner.id, tasks[3].id)


async def test_a_task_entering_while_a_claim_commits_is_not_hidden_by_its_raise(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim read the level, then a task enters below what the claim takes, then the
    claim commits: its raise of the floor compares the level key's revision, which the entry
    moved, so the floor stays below the new task."""
    behind = FakeClock(1_600_000_000.0)  # the other host's clock is years behind
    async with open_stores(store_url, 2, [FakeClock(), behind]) as (store, other):
        tasks = [spec() for _ in range(5)]
        await store.submit(tasks)
        s = await store.register_expert(ExpertInfo("e"), 600)
        sooner = spec()
        real_commit = store._etcd.commit

        async def entry_first(cmp: Any, ops: Any, failure: Any = ()) -> Any:
            await other.submit([sooner])  # between the claim's read and its commit
            return await real_commit(cmp, ops, failure)

        monkeypatch.setattr(store._etcd, "commit", entry_first)
        got = await store.claim("e", s, Q, ANY, limit=2, lease_ttl=600)
        monkeypatch.undo()
        assert [c.id for c in got] == [t.id for t in tasks[:2]]
        (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=600)
        assert c.id == sooner.id


async def readable_at(store: EtcdStore, revision: int) -> bool:
    """Whether etcd still has its history at *revision* (False: compacted past it)."""
    req = rpc.RangeRequest(key=store._keys.k("meta"), revision=revision)
    try:
        await store._etcd.kv.Range(req, timeout=5)
    except rpc.AioRpcError as exc:
        if "compacted" in (exc.details() or ""):
            return False
        raise
    return True


async def test_expire_compacts_the_history_older_than_compact_after(store_url: str) -> None:
    """etcd walks every deleted key of a range until its history is compacted: expire()
    compacts to the revision it saw compact_after seconds ago (0: never)."""
    clock = FakeClock()
    store = EtcdStore(store_url, clock=clock, compact_after=30)
    never = EtcdStore(store_url, clock=clock, compact_after=0)
    await store.open()
    await never.open()
    try:
        await store.submit([spec()])
        await store.expire()
        first = store._etcd.rev  # the revision expire() noted
        await store.submit([spec()])
        clock.advance(29)
        await store.expire()
        second = store._etcd.rev
        assert await readable_at(store, first - 1)  # not 30 s old yet
        clock.advance(1)
        await store.expire()
        assert not await readable_at(store, first - 1)
        assert await readable_at(store, first)  # compacted to what it saw 30 s before
        clock.advance(1000)
        await never.expire()
        assert await readable_at(store, first)  # compact_after=0 never compacts
        await store.expire()
        assert not await readable_at(store, second - 1)
        assert await readable_at(store, second)  # the newest revision seen 30 s ago or more
        got = await store.claim(
            "e", await store.register_expert(ExpertInfo("e"), 60), Q, ANY, limit=2, lease_ttl=60
        )
        assert len(got) == 2  # the store works on over a compacted history
    finally:
        await never.close()
        await store.close()


async def test_one_instance_compacts_per_interval(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every expert runs expire(); the first to move the {prefix}compacted marker compacts,
    the others see it fresh and do not (each compaction walks etcd's whole index)."""
    clock = FakeClock()
    stores = [EtcdStore(store_url, clock=clock, compact_after=30) for _ in range(3)]
    compactions: list[int] = []
    try:
        for s in stores:
            await s.open()
            real = s._etcd.kv.Compact

            async def counting(req: Any, real: Any = real, **kw: Any) -> Any:
                compactions.append(req.revision)
                return await real(req, **kw)

            monkeypatch.setattr(s._etcd.kv, "Compact", counting)
        await stores[0].submit([spec()])
        for s in stores:
            await s.expire()
        clock.advance(30)
        for s in stores:
            await s.expire()
        assert len(compactions) == 1
        clock.advance(30)
        for s in reversed(stores):
            await s.expire()
        assert len(compactions) == 2 and compactions[1] > compactions[0]
    finally:
        for s in stores:
            await s.close()


async def test_named_claims_take_the_best_first_and_bad_retry_delays_are_refused(
    store: EtcdStore,
) -> None:
    low, high = spec(priority=1), spec(priority=7)
    await store.submit([low, high])
    s = await store.register_expert(ExpertInfo("e"), 5)
    (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=5, task_ids=[low.id, high.id])
    assert c.id == high.id
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="retry_delay"):
            await store.fail("e", [Failure(high.id, c.fence, "{}", bad)])
    assert (await store.get(high.id)).state == TaskState.RUNNING


async def test_a_write_whose_reply_was_lost_is_recognised(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction lands but its reply never arrives: the store reads the task back and
    recognises its own write (STYLE: retries that may have succeeded are safe)."""
    real = store._etcd.txn
    lose_next = [False]

    async def flaky(compare: list[object], success: list[object], failure: object = ()) -> object:
        resp = await real(compare, success, failure)  # type: ignore[arg-type]
        writes = any(op[0] == PUT for op in success)  # type: ignore[index]
        if writes and lose_next[0]:
            lose_next[0] = False
            raise StoreError("reply lost")
        return resp

    monkeypatch.setattr(store._etcd, "txn", flaky)
    t = spec()
    await store.submit([t])
    s = await store.register_expert(ExpertInfo("e"), 5)
    lose_next[0] = True
    (c,) = await store.claim("e", s, Q, ANY, limit=1, lease_ttl=5)
    assert not lose_next[0] and c.id == t.id and c.fence == 1
    lose_next[0] = True
    assert await store.complete("e", [Completion(t.id, c.fence, '"done"')]) == [None]
    assert not lose_next[0]
    assert (await store.get(t.id)).result == "done"


# -- auctions, backlog, metrics ----------------------------------------------------------------
async def test_auction_bids_rank_and_are_cleared(store_url: str) -> None:
    clock = FakeClock()
    store = EtcdStore(store_url, clock=clock)
    await store.open()
    try:
        t = spec()
        await store.submit([t])
        a = await store.register_expert(ExpertInfo("a"), 10)
        b = await store.register_expert(ExpertInfo("b"), 10)
        first = await store.bid("a", a, t.id, 0.5, 2.0)
        assert first.open and first.closes_at == clock() + 2 and first.bids == (("a", 0.5),)
        clock.advance(1)
        second = await store.bid("b", b, t.id, 0.9, 5.0)  # the window was set by the first bid
        assert second.closes_at == first.closes_at
        assert second.bids == (("b", 0.9), ("a", 0.5))
        assert second.rank("a") == 1 and second.may_claim_at("a", 3.0) == first.closes_at + 3
        again = await store.bid("a", a, t.id, 0.9, 2.0)  # same score as b, but bid earlier
        assert again.bids == (("a", 0.9), ("b", 0.9))
        with pytest.raises(ConfigError):
            await store.bid("a", a, t.id, 1.5, 2.0)
        with pytest.raises(LeaseLost):
            await store.bid("a", "not-a-session", t.id, 0.5, 2.0)
        clock.advance(2)
        (c,) = await store.claim("a", a, Q, ANY, limit=1, lease_ttl=10, task_ids=[t.id])
        closed = await store.bid("b", b, t.id, 0.9, 2.0)
        assert not closed.open and closed.bids == ()
        await store.expire()
        assert await store._etcd.scan(store._keys.k("b", "")) == []
        assert await store._etcd.scan(store._keys.k("u", "")) == []
        assert c.id == t.id
    finally:
        await store.close()


async def test_backlog_and_heartbeat_metrics(store: EtcdStore) -> None:
    await store.submit([spec(), spec(), spec(delay=600), spec(queue="other")])
    back = await store.backlog(Q)
    assert back.pending == 2 and back.oldest_age is not None and back.oldest_age >= 0
    assert (await store.backlog(["nothing"])).pending == 0
    s = await store.register_expert(ExpertInfo("e"), 5)
    await store.renew("e", s, 5, Heartbeat(load=2, metrics={"work": {"ok": 3}}))
    (rec,) = await store.list_experts()
    assert rec.metrics == {"work": {"ok": 3}} and rec.load == 2


async def test_a_dead_expert_s_many_tasks_return_in_one_expire(store: EtcdStore) -> None:
    await store.submit([spec() for _ in range(150)])
    s = await store.register_expert(ExpertInfo("big"), 30)
    got = await store.claim("big", s, Q, ANY, limit=150, lease_ttl=30)
    assert len(got) == 150
    assert await store.revoke_lease("big")  # the process died and etcd ended its lease
    started = time.monotonic()
    assert await store.expire() == 150
    took = time.monotonic() - started
    assert len(await store.peek(Q, ANY, 200)) == 150
    assert took < 10, took


# -- batched transactions ----------------------------------------------------------------------
async def test_a_claim_batch_spans_several_transactions(store_url: str) -> None:
    store = EtcdStore(store_url, max_txn_ops=16)  # two tasks per claim transaction
    await store.open()
    try:
        await store.submit([spec() for _ in range(7)])
        session = await store.register_expert(ExpertInfo("e"), 10)
        got = await store.claim("e", session, Q, ANY, limit=10, lease_ttl=10)
        assert len({c.id for c in got}) == 7
        assert not isinstance(got, Outrun)  # short because that was all: nothing to look for
        assert all(c.fence == 1 and c.attempt == 1 for c in got)
        assert await store.claim("e", session, Q, ANY, limit=10, lease_ttl=10) == []
        out = await store.complete(
            "e", [Completion(c.id, c.fence, json.dumps(n)) for n, c in enumerate(got)]
        )
        assert out == [None] * 7
        for n, c in enumerate(got):
            task = await store.get(c.id)
            assert task.state == TaskState.SUCCEEDED and task.result == n
    finally:
        await store.close()


async def claim_after_rivals(
    store: EtcdStore, store_url: str, limit: int, taken: list[str]
) -> tuple[list[Claimed], int]:
    """A claim of *limit* by expert "e" during which, between its read and its first
    transaction, a rival claims the tasks *taken*: (what the claim got, its transactions)."""
    session = await store.register_expert(ExpertInfo("e"), 10)
    rival = EtcdStore(store_url)
    await rival.open()
    commits = 0
    real_commit = store._etcd.commit

    async def commit_after_rivals(*args: object) -> object:
        nonlocal commits
        commits += 1
        if commits == 1:
            rs = await rival.register_expert(ExpertInfo("rival"), 10)
            won = await rival.claim(
                "rival", rs, Q, ANY, limit=len(taken), lease_ttl=10, task_ids=taken
            )
            assert len(won) == len(taken)
        return await real_commit(*args)  # type: ignore[arg-type]

    store._etcd.commit = commit_after_rivals  # type: ignore[method-assign,assignment]
    try:
        got = await store.claim("e", session, Q, ANY, limit=limit, lease_ttl=10)
    finally:
        store._etcd.commit = real_commit  # type: ignore[method-assign]
        await rival.close()
    return got, commits


async def test_a_claim_batch_that_loses_one_task_retries_the_rest_together(
    store: EtcdStore, store_url: str
) -> None:
    tasks = [spec() for _ in range(5)]
    await store.submit(tasks)
    got, commits = await claim_after_rivals(store, store_url, 5, [tasks[2].id])
    assert {c.id for c in got} == {t.id for n, t in enumerate(tasks) if n != 2}
    assert commits == 2  # the batch, then the four still free in one more transaction
    assert store._claims.contended_until > time.monotonic()  # its next claims spread out
    assert isinstance(got, Outrun)  # short because a rival won one: the expert looks again


async def test_a_claim_outrun_past_its_candidates_says_so(store: EtcdStore, store_url: str) -> None:
    """Rivals take the tasks a claim read from the index, and those it would try next, before
    it commits: it comes back short while more tasks are pending, and says it was outrun
    (the expert then claims again soon instead of waiting for a change of work)."""
    tasks = [spec() for _ in range(70)]
    await store.submit(tasks)
    read = 64  # the candidates a claim of 3 reads from the index (a page of at least 64)
    # all but the last of the candidates read are taken meanwhile
    got, _ = await claim_after_rivals(store, store_url, 3, [t.id for t in tasks[: read - 1]])
    assert isinstance(got, Outrun)
    assert [c.id for c in got] == [tasks[read - 1].id]
    left = await store.peek(Q, ANY, 10)
    assert [v.id for v in left] == [t.id for t in tasks[read:]]  # more to claim: look again


async def test_the_low_lane_looks_at_lane_levels_below_the_top(store: EtcdStore) -> None:
    """Of a queue's levels below the top, only the LANE_LEVELS highest take part in the
    lane: the oldest task of the level past them is left to the best order."""
    below = [spec(priority=p) for p in range(LANE_LEVELS + 1)]  # the lowest the oldest
    for s in below:
        await store.submit([s])
    top = spec(priority=LANE_LEVELS + 100)
    await store.submit([top])
    session = await store.register_expert(ExpertInfo("e"), 10)
    peeked = await store.peek(Q, ANY, 2, low_lane=1)
    got = await store.claim("e", session, Q, ANY, limit=2, lease_ttl=10, low_lane=1)
    assert [c.id for c in got] == [v.id for v in peeked] == [top.id, below[1].id]
    # named ids: the top is the best of those named, and the level left out before is in
    named = await store.claim(
        "e",
        session,
        Q,
        ANY,
        limit=2,
        lease_ttl=10,
        low_lane=1,
        task_ids=[s.id for s in below],
    )
    assert [c.id for c in named] == [below[-1].id, below[0].id]


async def test_a_contended_claimer_spreads_over_equally_good_tasks(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    same = [spec() for _ in range(40)]
    urgent = spec(priority=5)
    await store.submit([*same, urgent])
    session = await store.register_expert(ExpertInfo("e"), 10)
    (first,) = await store.claim("e", session, Q, ANY, limit=1, lease_ttl=10)
    assert first.id == urgent.id  # uncontended: the best first
    (second,) = await store.claim("e", session, Q, ANY, limit=1, lease_ttl=10)
    assert second.id == same[0].id  # and first in, first out
    store._claims.contended_until = time.monotonic() + 60  # as after a rival won a batch
    monkeypatch.setattr(
        "contend.store.etcd.candidates.random.randrange", lambda n: 2
    )  # the 3rd stripe
    got = await store.claim("e", session, Q, ANY, limit=3, lease_ttl=10)
    assert [c.id for c in got] == [t.id for t in same[7:10]]  # a stripe among equals
    late = spec(priority=9)
    await store.submit([late])
    (top,) = await store.claim("e", session, Q, ANY, limit=1, lease_ttl=10)
    assert top.id == late.id  # never past a better task: only equals are spread over


async def test_claims_read_a_bounded_window_of_a_big_backlog_in_order(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd counts every key of a range it reads: claims must not read the whole backlog, and
    the bound they stop at must never hide a better task (new, urgent, released back)."""
    backlog = [spec() for _ in range(1500)]
    for i in range(0, len(backlog), 500):
        await store.submit(backlog[i : i + 500])
    session = await store.register_expert(ExpertInfo("e"), 30)
    counts: list[int] = []
    real_range = store._etcd.range

    async def counting(key: bytes, end: bytes | None = None, **kw: object) -> object:
        resp = await real_range(key, end, **kw)  # type: ignore[arg-type]
        if key.startswith(store._keys.k("q", "")):
            counts.append(int(resp.count))  # the keys etcd walked for this read
        return resp

    monkeypatch.setattr(store._etcd, "range", counting)

    async def claim(n: int, low_lane: int = 0) -> list[str]:
        got = await store.claim("e", session, Q, ANY, limit=n, lease_ttl=30, low_lane=low_lane)
        return [c.id for c in got]

    assert await claim(8, 1) == [t.id for t in backlog[:8]]
    assert counts == [1500]  # the first read has no bound yet
    taken = 8
    walked: list[int] = []
    for n, lane in ((8, 0), (8, 0), (20, 2), (8, 1), (8, 1), (8, 0)):
        counts.clear()
        assert await claim(n, lane) == [t.id for t in backlog[taken : taken + n]]
        taken += n
        walked.append(sum(counts))
    # Windows, not the 1,500-task backlog. Keys lie unevenly (ids are consecutive within a
    # millisecond and jump between them, and a loaded machine spreads a submission over more
    # milliseconds): a window that stops short of the next millisecond reads on to the end
    # once, and widens. (Seen: [293, 84, 76, 1456, 448, 343]; a read of the whole backlog
    # each time would be 1,500 every time.)
    assert sorted(walked)[-2] < 1000 and sum(walked) < 3 * len(backlog), walked
    urgent = spec(priority=3)
    await store.submit([urgent])
    assert await claim(2) == [urgent.id, backlog[taken].id]
    taken += 1
    (c,) = [x for x in await store.list_tasks(state=TaskState.RUNNING) if x.id == backlog[0].id]
    assert await store.release("e", [(c.id, c.fence)]) == [None]
    assert await claim(2) == [backlog[0].id, backlog[taken].id]
    taken += 1
    # a claimer that drained past its window reads on to the end of the index
    store._levels.windows = {
        k: dataclasses.replace(w, span=1) for k, w in store._levels.windows.items() if w
    }
    assert await claim(30) == [t.id for t in backlog[taken : taken + 30]]


async def test_a_completion_batch_fences_out_only_the_task_that_moved(
    store: EtcdStore, store_url: str
) -> None:
    await store.submit([spec() for _ in range(5)])
    session = await store.register_expert(ExpertInfo("e"), 10)
    got = await store.claim("e", session, Q, ANY, limit=5, lease_ttl=10)
    assert len(got) == 5
    other = EtcdStore(store_url)  # another process cancels one of them meanwhile
    await other.open()
    try:
        await other.cancel(got[2].id)
    finally:
        await other.close()
    out = await store.complete("e", [Completion(c.id, c.fence, "1") for c in got])
    assert [o is None for o in out] == [True, True, False, True, True]
    assert isinstance(out[2], FencedOut)
    states = [(await store.get(c.id)).state for c in got]
    assert states == [TaskState.SUCCEEDED] * 2 + [TaskState.CANCELLED] + [TaskState.SUCCEEDED] * 2
    assert (await store.renew("e", session, 10, Heartbeat())) == {}


async def test_an_empty_prefix_is_not_made_a_store_by_one_that_may_not(store_url: str) -> None:
    """``create=False`` (the read-only commands): an empty prefix is refused as no store yet,
    and no meta key is written."""
    with pytest.raises(SchemaError, match=r"is empty: it is not \(yet\) a contend store"):
        await EtcdStore(store_url, create=False).open()
    writer = EtcdStore(store_url)
    writer._etcd.connect()
    try:
        assert (await writer._etcd.range(writer._keys.k("meta"))).kvs == []
        await writer.close()
        await writer.open()
    finally:
        await writer.close()
    reader = EtcdStore(store_url, create=False)
    await reader.open()  # an existing store opens
    assert await reader.list_tasks() == []
    await reader.close()


async def test_an_own_plain_end_wakes_change_waiters_but_not_idle_experts(
    store: EtcdStore,
) -> None:
    """A commit of this instance that ends a task wakes its result() waiters
    (wait_for_change); its idle experts (wait_for_work) only when a limit key's slot came
    free. Woken by every own commit, an idle expert claimed again at once and found nothing:
    1,228 empty claims in 20 s at 1,000 tasks/s."""
    plain, limited = spec(), spec(limit_key="k", concurrency_limit=1)
    await store.submit([plain, limited])
    session = await store.register_expert(ExpertInfo("e"), 60)
    got = await store.claim("e", session, Q, ANY, limit=2, lease_ttl=60)
    fences = {c.id: c.fence for c in got}
    assert set(fences) == {plain.id, limited.id}

    async def wakes_on_end(task_id: str) -> tuple[float, float]:
        """How long a wait for a change and one for work took, the task ending meanwhile."""
        await store.wait_for_change(0)  # forget what came before
        await store.wait_for_work(0)
        began = time.monotonic()

        async def timed(wait: Callable[[float], Awaitable[None]], timeout: float) -> float:
            await wait(timeout)
            return time.monotonic() - began

        change = asyncio.create_task(timed(store.wait_for_change, 30))
        work = asyncio.create_task(timed(store.wait_for_work, 1.0))
        await store.complete("e", [Completion(task_id, fences[task_id], "null")])
        return await change, await work

    change, work = await wakes_on_end(plain.id)
    assert change < 1.0
    assert work >= 1.0  # not woken: it waited its whole timeout
    change, work = await wakes_on_end(limited.id)
    assert change < 1.0 and work < 1.0


async def test_a_named_claim_reads_each_record_once(
    store: EtcdStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim of named tasks (a race's) reads their records to choose among them, and its
    transaction compares the revisions of that read: no second read of the same records."""
    specs = [spec(), spec()]
    await store.submit(specs)
    session = await store.register_expert(ExpertInfo("e"), 60)
    etcd = store._etcd
    read: list[bytes] = []
    real = etcd.read_many

    async def counting(keys: Sequence[bytes]) -> list[Any]:
        read.extend(keys)
        return await real(keys)

    monkeypatch.setattr(etcd, "read_many", counting)
    got = await store.claim(
        "e", session, Q, ANY, limit=2, lease_ttl=60, task_ids=[s.id for s in specs]
    )
    assert {c.id for c in got} == {s.id for s in specs}
    records = [k for k in read if k.startswith(store._keys.k("t", ""))]
    assert sorted(records) == sorted(store._keys.task(s.id) for s in specs)


async def test_a_claim_puts_nothing_on_the_lease_but_the_session_key(store: EtcdStore) -> None:
    """Schema 5: a claim's lapse is its session's. Attaching a claim key per task to the
    lease and detaching it again cost etcd a third of its CPU per task in a drain."""
    await store.submit([spec() for _ in range(3)])
    s = await store.register_expert(ExpertInfo("e"), 30)
    got = await store.claim("e", s, Q, ANY, limit=3, lease_ttl=30)
    assert len(got) == 3
    lease = store._sessions.cache[s][0]
    etcd = store._etcd
    ttl = await etcd.lease.LeaseTimeToLive(rpc.LeaseTimeToLiveRequest(ID=lease, keys=True))
    assert list(ttl.keys) == [store._keys.k("l", "e")]
    # and the session still holds them, and loses them with its lease
    assert await store.renew("e", s, 30, Heartbeat()) == {c.id: c.fence for c in got}
    await store.deregister_expert("e", s)
    refused = await store.complete("e", [Completion(c.id, c.fence, "1") for c in got])
    assert all(isinstance(r, FencedOut) and "lease" in str(r) for r in refused), refused


async def _schema_4(url: str) -> tuple[EtcdStore, bytes]:
    """A store as schema 4 left it: the meta key says 4 (same store id)."""
    old = EtcdStore(url)
    await old.open()
    meta = old._keys.k("meta")
    value = json.loads((await old._etcd.read_many([meta]))[0].value)
    four = json.dumps({**value, "schema": 4}).encode()
    await old._etcd.txn([], [(PUT, meta, four, 0)])
    return old, four


async def test_a_schema_4_store_is_upgraded_in_place_when_no_expert_lives(
    store_url: str,
) -> None:
    seed = EtcdStore(store_url)
    await seed.open()
    t = spec()
    await seed.submit([t])
    await seed.close()
    old, four = await _schema_4(store_url)
    old._etcd.guard = four  # a process of the older contend
    new = EtcdStore(store_url)
    await new.open()
    try:
        meta = json.loads((await new._etcd.read_many([new._keys.k("meta")]))[0].value)
        assert meta["schema"] == 6 and meta["store"] == json.loads(four)["store"]
        s = await new.register_expert(ExpertInfo("e"), 30)
        (c,) = await new.claim("e", s, Q, ANY, limit=1, lease_ttl=30)
        assert c.id == t.id
        # a process still on the old meta key writes nothing any more
        with pytest.raises(SchemaError):
            await old.submit([spec()])
    finally:
        await old.close()
        await new.close()


async def test_a_schema_4_store_with_live_experts_is_left_alone(store_url: str) -> None:
    old, four = await _schema_4(store_url)
    old._etcd.guard = four  # an expert of the older contend, still running
    await old._sessions.register(ExpertInfo("veteran"), 30)
    try:
        with pytest.raises(SchemaError, match=r"schema version 4, and 1 expert.*\(veteran\)"):
            await EtcdStore(store_url).open()
        meta = (await old._etcd.read_many([old._keys.k("meta")]))[0].value
        assert meta == four  # nothing was changed
    finally:
        await old.close()


async def test_a_claim_reads_no_index_key_of_a_task_not_yet_due(store: EtcdStore) -> None:
    """Within a priority level the index keys run in due order, so a claim reads only up to
    the present: a backlog of tasks due later (retries backing off, tasks for tomorrow) at
    the head of a level cost a claim nothing. Before, each claim walked all of them, a page
    at a time (every idle expert's claim read 20,000 keys before a drain's tasks fell due)."""
    await store.submit([spec(delay=3600) for _ in range(2_000)])
    now_task = spec()
    await store.submit([now_task])
    s = await store.register_expert(ExpertInfo("e"), 30)
    read: list[int] = []
    real_range = store._etcd.range

    async def range_(key: bytes, end: bytes | None = None, **kw: Any) -> Any:
        resp = await real_range(key, end, **kw)
        if key.startswith(store._keys.k("q", "")):
            read.append(len(resp.kvs))
        return resp

    store._etcd.range = range_  # type: ignore[method-assign]
    (c,) = await store.claim("e", s, Q, ANY, limit=8, lease_ttl=30)
    assert c.id == now_task.id
    assert sum(read) <= 1, read
    read.clear()
    assert await store.claim("e", s, Q, ANY, limit=8, lease_ttl=30) == []
    assert sum(read) == 0, read
