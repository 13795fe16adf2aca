"""The PostgreSQL store's semantics, on a fake clock: the same rules as the memory store."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

from contend.domain.retry import RetryPolicy
from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import (
    ConfigError,
    DependencyError,
    ExpertConflict,
    FencedOut,
    InvalidTransition,
    LeaseLost,
    TaskNotFound,
)
from contend.store.port import Completion, ExpertInfo, Failure, Heartbeat
from contend.store.postgres import PostgresStore, parse_postgres_url
from contend.store.registry import make_store
from contend.testing import FakeClock

from .conftest import StoreFactory

NO_CAPS = Capabilities()
Q = ["default"]


async def expert(store: PostgresStore, name: str = "e1", ttl: float = 10.0) -> str:
    return await store.register_expert(ExpertInfo(name), ttl)


async def test_submit_claim_checkpoint_complete(store: PostgresStore) -> None:
    (sub,) = await store.submit([TaskSpec.build("add", [1, 2], {"z": "é"}, timeout=5)])
    assert sub.created
    session = await expert(store)
    (claimed,) = await store.claim("e1", session, Q, NO_CAPS, limit=10, lease_ttl=10)
    assert (claimed.id, claimed.args, claimed.kwargs) == (sub.id, [1, 2], {"z": "é"})
    assert (claimed.fence, claimed.attempt, claimed.timeout) == (1, 1, 5.0)
    assert claimed.lease_deadline == await store.now() + 10
    await store.checkpoint("e1", sub.id, 1, json.dumps({"step": 3}))
    assert await store.complete("e1", [Completion(sub.id, 1, "3")]) == [None]
    task = await store.get(sub.id, history=True)
    assert task.state == TaskState.SUCCEEDED
    assert (task.result, task.checkpoint, task.owner, task.lease_deadline) == (
        3,
        {"step": 3},
        None,
        None,
    )
    assert [e.event for e in task.history] == ["claimed", "succeeded"]
    stats = await store.stats()
    assert stats.counts == {"default": {"succeeded": 1}}
    assert stats.done_last_minute == 1


async def test_idempotency_key_returns_the_existing_task(store: PostgresStore) -> None:
    first = await store.submit(
        [TaskSpec.build("t", key="k1"), TaskSpec.build("t", key="k1"), TaskSpec.build("t")]
    )
    assert [s.created for s in first] == [True, False, True]
    assert first[1].id == first[0].id
    (again,) = await store.submit([TaskSpec.build("t", key="k1")])
    assert again.id == first[0].id and not again.created
    assert len(await store.list_tasks()) == 2


async def test_the_same_spec_sent_again_keeps_the_first_task(store: PostgresStore) -> None:
    """A client that lost the reply and submits again gets the task it already created."""
    spec = TaskSpec.build("t", [1])
    child = TaskSpec.build("t", depends_on=[spec.id])
    assert [s.created for s in await store.submit([spec])] == [True]
    assert [s.created for s in await store.submit([spec])] == [False]  # one statement
    again = await store.submit([spec, child])  # the transaction path (dependencies)
    assert [(s.id, s.created) for s in again] == [(spec.id, False), (child.id, True)]
    assert len(await store.list_tasks()) == 2


async def test_bad_dependencies_leave_the_store_unchanged(store: PostgresStore) -> None:
    with pytest.raises(DependencyError, match="unknown dependencies: nope"):
        await store.submit([TaskSpec.build("t"), TaskSpec.build("t", depends_on=["nope"])])
    a, b = TaskSpec.build("t"), TaskSpec.build("t")
    a = TaskSpec(type="t", id=a.id, depends_on=(b.id,))
    b = TaskSpec(type="t", id=b.id, depends_on=(a.id,))
    with pytest.raises(DependencyError, match="cycle"):
        await store.submit([a, b])
    assert await store.list_tasks() == []


async def test_dependencies_wait_then_run_or_die(store: PostgresStore) -> None:
    a = TaskSpec.build("t")
    b = TaskSpec.build("t", depends_on=[a.id])
    c = TaskSpec.build("t", depends_on=[b.id])
    await store.submit([a, b, c])
    assert (await store.get(b.id)).state == TaskState.WAITING
    session = await expert(store)
    claimed = await store.claim("e1", session, Q, NO_CAPS, limit=10, lease_ttl=10)
    assert [t.id for t in claimed] == [a.id]
    await store.complete("e1", [Completion(a.id, 1, "null")])
    assert (await store.get(b.id)).state == TaskState.PENDING
    assert (await store.get(c.id)).state == TaskState.WAITING
    (cb,) = await store.claim("e1", session, Q, NO_CAPS, limit=10, lease_ttl=10)
    await store.fail("e1", [Failure(cb.id, cb.fence, '{"type":"X"}', None, TaskState.FAILED)])
    dead = await store.get(c.id, history=True)
    assert dead.state == TaskState.DEAD
    assert dead.error["type"] == "DependencyFailed"
    assert b.id in dead.error["message"]
    # a task submitted after its dependency failed is dead at once
    (late,) = await store.submit([TaskSpec.build("t", depends_on=[b.id])])
    assert (await store.get(late.id)).state == TaskState.DEAD


async def test_two_dependencies_both_counted(store: PostgresStore) -> None:
    a, b = TaskSpec.build("t"), TaskSpec.build("t")
    c = TaskSpec.build("t", depends_on=[a.id, b.id])
    await store.submit([a, b, c])
    session = await expert(store)
    got = await store.claim("e1", session, Q, NO_CAPS, limit=10, lease_ttl=10)
    assert {t.id for t in got} == {a.id, b.id}
    await store.complete("e1", [Completion(a.id, 1, "1")])
    assert (await store.get(c.id)).state == TaskState.WAITING
    await store.complete("e1", [Completion(b.id, 1, "1")])
    assert (await store.get(c.id)).state == TaskState.PENDING


async def test_requirements_filter_in_sql(store: PostgresStore) -> None:
    plain = TaskSpec.build("t")
    gpu = TaskSpec.build("t", requirements={"tags": ["gpu"]})
    big = TaskSpec.build("t", requirements={"tags": ["gpu"], "resources": {"mem_gb": 32}})
    await store.submit([plain, gpu, big])
    small = Capabilities(frozenset({"gpu", "zone:eu"}), {"mem_gb": 16})
    large = Capabilities(frozenset({"gpu"}), {"mem_gb": 64})
    assert {v.id for v in await store.peek(Q, NO_CAPS, 10)} == {plain.id}
    assert {v.id for v in await store.peek(Q, small, 10)} == {plain.id, gpu.id}
    assert {v.id for v in await store.peek(Q, large, 10)} == {plain.id, gpu.id, big.id}
    session = await expert(store)
    got = await store.claim("e1", session, Q, small, limit=10, lease_ttl=10)
    assert {t.id for t in got} == {plain.id, gpu.id}
    got = await store.claim("e1", session, Q, large, limit=10, lease_ttl=10)
    assert [t.id for t in got] == [big.id]


async def test_claim_order_queues_delay_and_task_ids(
    store: PostgresStore, clock: FakeClock
) -> None:
    low = TaskSpec.build("t", priority=-1)
    high = TaskSpec.build("t", priority=5)
    later = TaskSpec.build("t", priority=9, delay=30)
    other = TaskSpec.build("t", queue="other")
    await store.submit([low, high, later, other])
    assert [v.id for v in await store.peek(Q, NO_CAPS, 10)] == [high.id, low.id]
    assert await store.next_due(Q) == clock.value
    session = await expert(store, ttl=1000)
    got = await store.claim(
        "e1", session, Q, NO_CAPS, limit=10, lease_ttl=10, task_ids=[low.id], start=False
    )
    assert [t.id for t in got] == [low.id]
    assert (await store.get(low.id)).state == TaskState.CLAIMED
    res = await store.start("e1", [(low.id, 1), (high.id, 1)])
    assert res[0] is None
    assert isinstance(res[1], FencedOut) and "at fence 0" in str(res[1])
    assert (await store.get(low.id)).state == TaskState.RUNNING
    clock.advance(31)
    got = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
    assert [t.id for t in got] == [later.id]


async def test_start_reports_each_refusal(store: PostgresStore) -> None:
    (a,) = await store.submit([TaskSpec.build("t")])
    session = await expert(store)
    await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10, start=False)
    res = await store.start("e1", [(a.id, 1), (a.id, 1), ("ghost", 1)])
    assert res[0] is None
    assert isinstance(res[1], FencedOut) and "the task is running" in str(res[1])
    assert isinstance(res[2], FencedOut) and "no such task" in str(res[2])


async def test_stale_owner_is_fenced_out(store: PostgresStore, clock: FakeClock) -> None:
    (sub,) = await store.submit([TaskSpec.build("t")])
    s1 = await expert(store, "e1", ttl=100)
    s2 = await expert(store, "e2", ttl=100)
    (first,) = await store.claim("e1", s1, Q, NO_CAPS, limit=1, lease_ttl=10)
    clock.advance(11)
    # lapsed but not yet expired: every owner write is refused already
    (res,) = await store.complete("e1", [Completion(sub.id, first.fence, '"late"')])
    assert isinstance(res, FencedOut) and "lease lapsed" in str(res)
    with pytest.raises(FencedOut):
        await store.checkpoint("e1", sub.id, first.fence, "{}")
    assert await store.expire() == 1
    (second,) = await store.claim("e2", s2, Q, NO_CAPS, limit=1, lease_ttl=10)
    assert (second.fence, second.attempt) == (2, 2)
    for write in (
        store.complete("e1", [Completion(sub.id, first.fence, '"stale"')]),
        store.fail("e1", [Failure(sub.id, first.fence, "{}", None)]),
        store.release("e1", [(sub.id, first.fence)]),
    ):
        (res,) = await write
        assert isinstance(res, FencedOut) and "fence 2" in str(res)
    (res,) = await store.complete("e1", [Completion(sub.id, second.fence, '"thief"')])
    assert isinstance(res, FencedOut) and "does not own it" in str(res)
    assert await store.complete("e2", [Completion(sub.id, second.fence, '"fresh"')]) == [None]
    task = await store.get(sub.id, history=True)
    assert (task.state, task.result, task.fence) == (TaskState.SUCCEEDED, "fresh", 2)
    assert [e.event for e in task.history] == ["claimed", "expired", "claimed", "succeeded"]


async def test_fail_retries_until_attempts_are_spent(
    store: PostgresStore, clock: FakeClock
) -> None:
    (sub,) = await store.submit([TaskSpec.build("t", max_attempts=2)])
    session = await expert(store, ttl=1000)
    (c,) = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
    await store.fail("e1", [Failure(sub.id, c.fence, '{"type":"E"}', 5.0)])
    task = await store.get(sub.id)
    assert (task.state, task.run_at, task.error) == (
        TaskState.PENDING,
        clock.value + 5,
        {"type": "E"},
    )
    assert await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10) == []
    clock.advance(5)
    (c,) = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
    assert c.attempt == 2
    # the owner's retry policy decides, once, from the attempt its claim reported
    decision = RetryPolicy(backoff=5.0).decide(c.attempt, None, max_attempts=c.max_attempts)
    assert not decision.retry
    final = TaskState(decision.final_state)
    await store.fail("e1", [Failure(sub.id, c.fence, '{"type":"E"}', None, final)])
    assert (await store.get(sub.id)).state == TaskState.DEAD


async def test_release_gives_the_attempt_back(store: PostgresStore) -> None:
    (sub,) = await store.submit([TaskSpec.build("t", max_attempts=1)])
    session = await expert(store)
    (c,) = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
    assert await store.release("e1", [(sub.id, c.fence)]) == [None]
    task = await store.get(sub.id)
    assert (task.state, task.attempts, task.owner) == (TaskState.PENDING, 0, None)
    (c,) = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
    assert (c.fence, c.attempt) == (2, 1)


async def test_expire_keeps_checkpoint_and_kills_on_last_attempt(
    store: PostgresStore, clock: FakeClock
) -> None:
    (sub,) = await store.submit([TaskSpec.build("t", max_attempts=2)])
    session = await expert(store, ttl=1000)
    for attempt in (1, 2):
        (c,) = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
        await store.checkpoint("e1", sub.id, c.fence, json.dumps({"n": attempt}))
        clock.advance(10.5)
        assert await store.expire() == 1
    task = await store.get(sub.id)
    assert (task.state, task.checkpoint) == (TaskState.DEAD, {"n": 2})
    assert task.error["type"] == "LeaseExpired" and "e1" in task.error["message"]


async def test_renew_extends_leases_and_lapsed_sessions_stay_lost(
    store: PostgresStore, clock: FakeClock
) -> None:
    (sub,) = await store.submit([TaskSpec.build("t")])
    session = await expert(store, ttl=10)
    await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
    clock.advance(8)
    held = await store.renew("e1", session, 10, Heartbeat(load=1, claim_attempts=3, claims_won=1))
    assert held == {sub.id: 1}
    clock.advance(8)
    assert await store.expire() == 0
    (record,) = await store.list_experts()
    assert (record.alive, record.load, record.claim_attempts) == (True, 1, 3)
    clock.advance(11)
    with pytest.raises(LeaseLost):
        await store.renew("e1", session, 10, Heartbeat())
    with pytest.raises(LeaseLost):
        await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)


async def test_expert_ids_are_exclusive_while_live(store: PostgresStore, clock: FakeClock) -> None:
    session = await store.register_expert(ExpertInfo("e1", host="h1", pid=7), 10)
    with pytest.raises(ExpertConflict, match="h1"):
        await store.register_expert(ExpertInfo("e1"), 10)
    await store.deregister_expert("e1", session)
    again = await store.register_expert(ExpertInfo("e1"), 10)
    assert again != session
    with pytest.raises(LeaseLost):
        await store.renew("e1", session, 10, Heartbeat())
    clock.advance(11)
    assert [e.alive for e in await store.list_experts()] == [False]
    await store.register_expert(ExpertInfo("e1"), 10)


async def test_cancel_fences_out_the_owner_and_retry_brings_it_back(store: PostgresStore) -> None:
    a = TaskSpec.build("t")
    b = TaskSpec.build("t", depends_on=[a.id])
    await store.submit([a, b])
    session = await expert(store)
    (c,) = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=10)
    cancelled = await store.cancel(a.id)
    assert (cancelled.state, cancelled.owner) == (TaskState.CANCELLED, None)
    (res,) = await store.complete("e1", [Completion(a.id, c.fence, "1")])
    assert isinstance(res, FencedOut)
    assert (await store.get(b.id)).state == TaskState.DEAD
    with pytest.raises(InvalidTransition, match="cannot cancel"):
        await store.cancel(a.id)
    retried = await store.retry(a.id)
    assert (retried.state, retried.attempts) == (TaskState.PENDING, 0)
    with pytest.raises(InvalidTransition, match="cannot retry"):
        await store.retry(a.id)
    with pytest.raises(TaskNotFound):
        await store.cancel("ghost")
    with pytest.raises(TaskNotFound):
        await store.get("ghost")


async def test_list_tasks_filters(store: PostgresStore) -> None:
    await store.submit([TaskSpec.build("t", queue=q) for q in ("a", "a", "b")])
    assert len(await store.list_tasks(queue="a")) == 2
    assert len(await store.list_tasks(state=TaskState.PENDING, limit=1)) == 1
    assert await store.list_tasks(state=TaskState.RUNNING) == []
    with pytest.raises(ConfigError):
        await store.list_tasks(limit=-1)


async def test_database_clock_when_none_is_injected(make_store: StoreFactory) -> None:
    store = await make_store()
    (sub,) = await store.submit([TaskSpec.build("t")])
    session = await expert(store)
    before = await store.now()
    (c,) = await store.claim("e1", session, Q, NO_CAPS, limit=1, lease_ttl=30)
    after = await store.now()
    assert before - 1 <= c.lease_deadline - 30 <= after
    assert (await store.get(sub.id)).created_at <= after


def test_url_options_are_checked() -> None:
    dsn, opts = parse_postgres_url("postgresql://u:pw@h:5433/db?schema=jobs&sslmode=disable")
    assert dsn == "postgresql://u:pw@h:5433/db?sslmode=disable"
    assert opts["schema"] == "jobs"
    for bad in (
        "postgresql://h/db?schema=a-b",
        "postgresql://h/db?listen=maybe",
        "postgresql://h/db?pool_size=0",
        "postgresql://h/db?listen_url=http://x",
        "postgresql://h:notaport/db",
    ):
        with pytest.raises(ConfigError):
            PostgresStore(bad)


def test_the_registry_builds_a_postgres_store() -> None:
    store = make_store("postgresql://postgres@127.0.0.1/x?schema=s1", clock=FakeClock())
    assert isinstance(store, PostgresStore)
    assert store.schema == "s1"


async def test_purge_all_empties_the_schema(store: PostgresStore) -> None:
    await store.submit([TaskSpec.build("t")])
    await expert(store)
    await store.purge_all()
    assert await store.list_tasks() == []
    assert await store.list_experts() == []


async def test_a_dependent_of_a_task_born_dead_in_the_same_batch_is_dead(
    store: PostgresStore,
) -> None:
    a = TaskSpec.build("t")
    await store.submit([a])
    await store.cancel(a.id)
    # b is dead at once (a was cancelled); c depends on b, in the same batch, either order
    b = TaskSpec.build("t", depends_on=[a.id])
    c = TaskSpec.build("t", depends_on=[b.id])
    await store.submit([b, c])
    b2 = TaskSpec.build("t", depends_on=[a.id])
    c2 = TaskSpec.build("t", depends_on=[b2.id])
    await store.submit([c2, b2])
    for spec in (b, c, b2, c2):
        task = await store.get(spec.id)
        assert task.state == TaskState.DEAD, spec
        assert task.error["type"] == "DependencyFailed"


async def test_depending_on_a_spec_whose_key_matched_is_refused(store: PostgresStore) -> None:
    first = TaskSpec.build("t", key="once")
    await store.submit([first])
    again = TaskSpec.build("t", key="once")
    child = TaskSpec.build("t", depends_on=[again.id])
    with pytest.raises(DependencyError, match="unknown dependencies"):
        await store.submit([again, child])
    assert [t.id for t in await store.list_tasks()] == [first.id]


async def test_the_stores_connections_never_jit_compile(store: PostgresStore) -> None:
    """A claim's plan over a large table costs past ``jit_above_cost``: compiling it took
    200-370 ms of a 2-7 ms claim behind 100,000 pending tasks once ANALYZE had run. The
    store's own connections turn JIT off; tasks' own transactions keep the server's
    setting (a report in a task may want it)."""
    db = store._db

    async def jit(cur: Any) -> str:
        await cur.execute("SHOW jit")
        return str((await cur.fetchone())[0])

    assert await db.run(jit, tx=False) == "off"
    pool = await db.tx_pool()
    async with pool.connection() as conn:
        server = (await (await conn.execute("SHOW jit")).fetchone())[0]
    async with await psycopg.AsyncConnection.connect(db.dsn) as plain:
        default = (await (await plain.execute("SHOW jit")).fetchone())[0]
    assert server == default


async def test_a_claim_is_planned_once_per_connection(make_store: StoreFactory) -> None:
    """The server costed a lane claim's generic plan above its custom ones and planned it
    afresh at every execution: 6.5 ms of planning for 2.9 ms of work. The store's own
    connections use one generic plan per prepared statement."""
    store = await make_store(pool_size=1)
    session = await store.register_expert(ExpertInfo("e"), 60)
    for n in range(20):
        await store.submit([TaskSpec.build("t", [n])])
        got = await store.claim(
            "e", session, ["default"], Capabilities(), limit=8, lease_ttl=60, low_lane=1
        )
        assert len(got) == 1
        await store.complete("e", [Completion(got[0].id, got[0].fence, "1")])

    async def plans(cur: Any) -> list[tuple[int, int]]:
        await cur.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%levels%%' AND statement LIKE '%%UPDATE%%'"
        )
        return [(int(g), int(c)) for g, c in await cur.fetchall()]

    ((generic, custom),) = await store._db.run(plans, tx=False)
    assert custom == 0 and generic >= 10, (generic, custom)


async def test_a_claims_long_text_is_converted_once(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg converted the placeholders of every statement over 4,096 bytes again at each
    execution (a claim's text is about 5 KB: 0.16 ms of a 0.94 ms claim in a profile). The
    store raises that bound; this fails if psycopg renames or drops it."""
    from psycopg import _queries

    from contend.store.postgres.database import CACHED_STATEMENT_LENGTH

    assert _queries.MAX_CACHED_STATEMENT_LENGTH >= CACHED_STATEMENT_LENGTH
    store = await make_store()
    session = await store.register_expert(ExpertInfo("e"), 60)
    await store.submit([TaskSpec.build("t") for _ in range(5)])
    await store.claim("e", session, ["default"], Capabilities(), limit=1, lease_ttl=60)
    converted: list[int] = []
    original = _queries._query2pg_nocache

    def counting(query: bytes, encoding: str) -> Any:
        converted.append(len(query))
        return original(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_nocache", counting)
    for _ in range(3):
        got = await store.claim("e", session, ["default"], Capabilities(), limit=1, lease_ttl=60)
        assert len(got) == 1
    assert converted == []


async def test_a_plain_tasks_end_does_not_wake_the_idle_experts(store: PostgresStore) -> None:
    # every end notified every listener, and every idle expert read the queue for nothing
    # (250 claim rounds per task among 1,000 simulated experts); one that frees nothing
    # (no limit's slot, no dependant) now says "end", which wakes a result's caller alone
    plain = TaskSpec.build("x")
    limited = TaskSpec.build("x", limit_key="k", concurrency_limit=1)
    await store.submit([plain, limited])
    session = await expert(store)
    got = {c.id: c for c in await store.claim("e1", session, Q, NO_CAPS, limit=10, lease_ttl=10)}
    assert set(got) == {plain.id, limited.id}
    changes = store._wakeups._changes
    await store.wait_for_change(0)
    await store.wait_for_work(0)
    work_before = changes.work_version
    change = asyncio.create_task(store.wait_for_change(30))
    work = asyncio.create_task(store.wait_for_work(30))
    await asyncio.sleep(0)
    await store.complete("e1", [Completion(plain.id, got[plain.id].fence, "null")])
    await asyncio.wait_for(change, 10)  # the "end" notice is in
    assert not work.done() and changes.work_version == work_before
    await store.complete("e1", [Completion(limited.id, got[limited.id].fence, "null")])
    await asyncio.wait_for(work, 10)  # its limit's slot is free
