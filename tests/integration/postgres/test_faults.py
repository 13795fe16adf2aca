"""Lost connections: a killed LISTEN backend, killed pool backends, a server that goes away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import ConfigError, FencedOut, StoreError
from contend.store.port import Completion, ExpertInfo, Failure
from contend.store.postgres import PostgresStore
from contend.store.postgres.database import Database

from .conftest import StoreFactory
from .helpers import Proxy, eventually


async def backends(url: str, application: str) -> list[tuple[int, str]]:
    """(pid, the statement it ran last) of each backend of *application* in this database."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND pid <> pg_backend_pid()",
            (application,),
        )
        return [(r[0], r[1]) for r in await cur.fetchall()]


async def backend_pids(url: str, application: str) -> list[int]:
    return [pid for pid, _ in await backends(url, application)]


async def last_statements(url: str, application: str) -> list[str]:
    return [query for _, query in await backends(url, application)]


async def terminate(url: str, pids: list[int]) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for pid in pids:
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def woken_by_submit(watcher: PostgresStore, writer: PostgresStore, within: float) -> float:
    """Submit through *writer*; return how long *watcher*'s wait_for_change(60) took."""
    await watcher.wait_for_change(0)  # forget earlier changes
    began = time.monotonic()
    waiting = asyncio.create_task(watcher.wait_for_change(60))
    await writer.submit([TaskSpec.build("t")])
    await asyncio.wait_for(waiting, within)
    return time.monotonic() - began


async def test_notifications_wake_a_waiting_expert(make_store: StoreFactory) -> None:
    watcher, writer = await make_store(), await make_store()
    assert await woken_by_submit(watcher, writer, within=5) < 5
    assert watcher.listening


async def test_a_store_that_only_submits_hears_no_notifications(
    make_store: StoreFactory, pg_url: str
) -> None:
    """A producer never waits: its listen connection stays quiet until a wait, so that it
    spends nothing on the notifications of its own submissions."""
    writer = await make_store(pg_url + "?application_name=writer")
    await writer.submit([TaskSpec.build("t") for _ in range(3)])
    assert not writer.listening
    # connected (a bad address fails the open), but it never ran LISTEN
    assert await last_statements(pg_url, "writer-listen") == [""]
    # its first wait listens, and returns at once: what was written before went unheard
    began = time.monotonic()
    await writer.wait_for_change(60)
    assert time.monotonic() - began < 5
    assert writer.listening
    (statement,) = await last_statements(pg_url, "writer-listen")
    assert statement.startswith("LISTEN")


async def test_a_store_listens_once_it_serves_an_expert(make_store: StoreFactory) -> None:
    """An expert's claims use what notifications say (a task given back below a claim's
    floor) before its first wait: registering an expert makes the store listen."""
    store = await make_store()
    assert not store.listening
    await store.register_expert(ExpertInfo("e1"), 60)
    assert store.listening and store._db.floors_heard


async def test_a_killed_listener_reconnects_and_wakeups_continue(
    make_store: StoreFactory, pg_url: str
) -> None:
    watcher = await make_store(pg_url + "?application_name=watcher", poll_interval=0.1)
    writer = await make_store()
    await woken_by_submit(watcher, writer, within=5)
    (old_pid,) = await backend_pids(pg_url, "watcher-listen")

    await terminate(pg_url, [old_pid])
    # Whether it has already reconnected or is polling meanwhile, a change is noticed.
    await woken_by_submit(watcher, writer, within=5)

    async def relistening() -> bool:
        pids = await backend_pids(pg_url, "watcher-listen")
        return watcher.listening and len(pids) == 1 and pids[0] != old_pid

    await eventually(relistening, what="the listener reconnecting")
    # pushed again: a 60 s wait ends at the notification, not at a poll
    assert await woken_by_submit(watcher, writer, within=5) < 5


async def test_polling_when_listen_is_off(make_store: StoreFactory, pg_url: str) -> None:
    """With LISTEN disabled (PgBouncer), wait_for_change returns after the poll interval."""
    no_listen = await make_store(pg_url + "?listen=off", poll_interval=0.05)
    assert not no_listen.listening
    await no_listen.wait_for_change(0)
    began = time.monotonic()
    await no_listen.wait_for_change(30)
    assert time.monotonic() - began < 5


async def test_killed_pool_connections_are_replaced(make_store: StoreFactory, pg_url: str) -> None:
    store = await make_store(pool_size=3)
    await asyncio.gather(*(store.submit([TaskSpec.build("t")]) for _ in range(6)))
    await terminate(pg_url, await backend_pids(pg_url, "contend"))
    session = await store.register_expert(ExpertInfo("e1"), 60)
    claimed = await store.claim("e1", session, ["default"], Capabilities(), limit=10, lease_ttl=60)
    assert len(claimed) == 6


async def test_server_outage_is_bounded_then_recovers(
    make_store: StoreFactory, pg_url: str
) -> None:
    parts = urlsplit(pg_url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.start()
    try:
        url = f"postgresql://{parts.username}@127.0.0.1:{proxy.port}{parts.path}"
        store = await make_store(url, retry_deadline=1.5, poll_interval=0.05)
        writer = await make_store()
        (sub,) = await store.submit([TaskSpec.build("t")])
        await store.wait_for_change(0)  # it listens, as an expert does
        assert store.listening

        await proxy.cut()  # as if PostgreSQL stopped
        began = time.monotonic()
        with pytest.raises(StoreError) as info:
            await store.get(sub.id)
        assert time.monotonic() - began < 10
        assert info.value.__cause__ is not None
        assert not store.listening

        await proxy.restore()  # and started again
        assert (await store.get(sub.id)).id == sub.id
        await eventually(lambda: store.listening, what="the listener reconnecting")
        assert await woken_by_submit(store, writer, within=5) < 5
    finally:
        await proxy.close()


async def test_unreachable_server_fails_open_quickly() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1:9/nowhere", retry_deadline=1.0)
    began = time.monotonic()
    with pytest.raises(StoreError, match="cannot connect"):
        await store.open()
    assert time.monotonic() - began < 10
    with pytest.raises(StoreError, match="not open"):
        await store.get("x")


async def test_a_write_retried_after_a_lost_reply_counts_once(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit whose reply is lost is retried; the retry recognises its own earlier write."""
    specs = [TaskSpec.build("t") for _ in range(4)]
    await store.submit(specs)
    session = await store.register_expert(ExpertInfo("e1"), 60)
    got = await store.claim("e1", session, ["default"], Capabilities(), limit=4, lease_ttl=60)
    a, b, c, d = got
    real_run = Database.run

    async def commit_then_retry(
        self: Database, fn: Callable[[Any], Awaitable[Any]], *, tx: bool = True
    ) -> Any:
        await real_run(self, fn, tx=tx)  # committed, but say the reply never came
        return await real_run(self, fn, tx=tx)

    monkeypatch.setattr(Database, "run", commit_then_retry)
    assert await store.complete("e1", [Completion(a.id, a.fence, "1")]) == [None]
    assert await store.fail("e1", [Failure(b.id, b.fence, "{}", 1.0)]) == [None]
    assert await store.fail("e1", [Failure(c.id, c.fence, "{}", None)]) == [None]
    assert await store.release("e1", [(d.id, d.fence)]) == [None]
    monkeypatch.undo()

    assert (await store.get(a.id)).state == TaskState.SUCCEEDED
    assert (await store.get(b.id)).state == TaskState.PENDING
    assert (await store.get(c.id)).state == TaskState.DEAD
    released = await store.get(d.id)
    assert (released.state, released.attempts) == (TaskState.PENDING, 0)  # given back once
    # a plain repeat (not a retry) is still refused
    (again,) = await store.complete("e1", [Completion(a.id, a.fence, "1")])
    assert isinstance(again, FencedOut)


#: A process that holds one task's row in a transaction of the store's own pool, says so,
#: and waits there: what an expert frozen mid-claim (SIGSTOP, a paused VM) leaves behind.
_HOLDER = """
import asyncio, sys
from contend.store.postgres import PostgresStore

async def main(url, task_id):
    store = PostgresStore(url)
    await store.open()

    async def hold(cur):
        await cur.execute(store._db.sql("SELECT id FROM {s}.tasks WHERE id = %s FOR UPDATE"),
                          (task_id,))
        print("locked", flush=True)
        await asyncio.Event().wait()  # frozen inside the transaction until killed

    await store._db.run(hold)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def cancel_beside_a_frozen_holder(url: str, store: PostgresStore, within: float) -> float:
    """Start a holder of a task's row on *url*, SIGSTOP it, and cancel the task through
    *store*; how long the cancel took (TimeoutError past *within* seconds)."""
    import os
    import signal
    import sys

    (sub,) = await store.submit([TaskSpec.build("t")])
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, url, sub.id, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), 30)
        assert line.strip() == b"locked", line
        os.kill(holder.pid, signal.SIGSTOP)
        began = time.monotonic()
        task = await asyncio.wait_for(store.cancel(sub.id), within)
        assert task.state == TaskState.CANCELLED
        return time.monotonic() - began
    finally:
        holder.kill()
        await holder.wait()


async def test_a_frozen_experts_open_transaction_ends_after_idle_tx_timeout(
    make_store: StoreFactory, pg_url: str
) -> None:
    """An expert stopped inside one of the store's transactions kept its row locks until it
    resumed: every other expert's write to those rows waited, for as long as it stayed
    stopped. The store's connections now set ``idle_in_transaction_session_timeout``
    (``idle_tx_timeout``), so the server ends that session and the locks go with it."""
    store = await make_store()
    took = await cancel_beside_a_frozen_holder(pg_url + "?idle_tx_timeout=1", store, within=15)
    assert took < 8, took
    # the same freeze with the server's own setting (none): the cancel still waits
    with pytest.raises(TimeoutError):
        await cancel_beside_a_frozen_holder(pg_url + "?idle_tx_timeout=0", store, within=4)


def test_idle_tx_timeout_must_be_seconds() -> None:
    for bad in ("-1", "soon", "1e9"):
        with pytest.raises(ConfigError, match="idle_tx_timeout must be a number of seconds"):
            PostgresStore(f"postgresql://h/db?idle_tx_timeout={bad}")
