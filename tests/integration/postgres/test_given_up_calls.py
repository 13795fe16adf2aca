"""A PostgreSQL call the runtime gave up on must stop, not retry in the background and land its
write later. The trap: after a failed attempt the store checks the pool's idle connections, and
psycopg_pool's ``check()`` catches ``CancelledError`` (it treats it as a broken connection), so
the cancellation of a call given up on during that check was lost and the retry loop went on,
for up to its 15 s deadline.

Here an owner's ``complete`` waits on a row lock; its statement is cancelled on the server (a
statement timeout, an operator's ``pg_cancel_backend``), so the store retries; the pool's other
connection does not answer the check (its backend is stopped with SIGSTOP, as a host that
froze); the caller gives up during the check. Then everything is let go: the write must never
land."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.runtime.clock import SystemClock, bounded, settle_strays
from contend.store.port import Completion, ExpertInfo
from contend.store.postgres import PostgresStore
from contend.testing.pg_cluster import Cluster

pytestmark = pytest.mark.postgres


async def _poll(check: Callable[[], Awaitable[object]], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.01)


async def test_a_call_given_up_during_the_pool_check_does_not_retry(cluster: Cluster) -> None:
    url = cluster.url
    store = PostgresStore(f"{url}?listen=false", pool_size=2)
    await store.open()
    admin = await psycopg.AsyncConnection.connect(url, autocommit=True)
    frozen: int | None = None
    try:
        session = await store.register_expert(ExpertInfo("e"), 600)
        (task,) = await store.submit([TaskSpec.build("echo", [1])])
        (claimed,) = await store.claim(
            "e", session, ["default"], Capabilities(), limit=1, lease_ttl=600
        )
        await admin.execute("BEGIN")
        await admin.execute("SELECT 1 FROM contend.tasks WHERE id = %s FOR UPDATE", (task.id,))

        clock = SystemClock()
        commit = store.complete("e", [Completion(task.id, claimed.fence, "1")])
        call = asyncio.create_task(bounded(clock, commit, 2.0))

        async def backends() -> tuple[int, int] | None:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
                cur = await c.execute(
                    "SELECT pid, wait_event_type FROM pg_stat_activity "
                    "WHERE application_name = 'contend' ORDER BY pid"
                )
                rows = await cur.fetchall()
            waiting = [pid for pid, kind in rows if kind == "Lock"]
            idle = [pid for pid, kind in rows if kind != "Lock"]
            return (waiting[0], idle[0]) if waiting and idle else None

        found = await _poll(backends, 10, "the commit waiting on the row lock")
        assert isinstance(found, tuple)
        blocked, other = found
        os.kill(other, signal.SIGSTOP)  # the pool's idle connection: it will not answer a check
        frozen = other
        await admin.execute("SELECT pg_cancel_backend(%s)", (blocked,))  # the attempt fails
        with pytest.raises(TimeoutError):
            await call  # the caller gives up (during the store's check of the pool)
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        await admin.execute("ROLLBACK")  # the row lock is gone: a call still trying lands now
        await admin.close()
    try:
        assert await settle_strays(clock, 20.0) == 0  # the given-up call has ended
        after = await store.get(task.id, history=True)
        assert after.state == TaskState.RUNNING, "the write landed after its caller gave up"
        assert "succeeded" not in [e.event for e in after.history]
    finally:
        await store.close()
