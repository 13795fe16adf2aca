"""This project's backends for the contract suite (``contend.testing.contract``): memory,
SQLite, PostgreSQL and etcd, each registered with :func:`~contend.testing.contract.backend`."""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from contend.store.port import Store
from contend.store.registry import make_store
from contend.testing import FakeClock
from contend.testing.contract import Harness, backend
from contend.testing.etcd_server import (
    EtcdServer,
    EtcdUnavailable,
    find_etcd,
    lapse_overdue_sessions,
)

# -- the backends that need no service ------------------------------------------------------


@backend("memory")
@asynccontextmanager
async def memory_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    clock = FakeClock()
    store = make_store("memory://", clock=clock)
    await store.open()

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    async def new_store() -> Store:
        return store  # one process, one instance: the memory store has no second connection

    try:
        yield Harness("memory", store, advance, new_store)
    finally:
        await store.close()


@backend("sqlite")
@asynccontextmanager
async def sqlite_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    clock = FakeClock()
    url = f"sqlite:///{tmp_path / 'contend.db'}"
    opened: list[Store] = []

    async def new_store() -> Store:
        store = make_store(url, clock=clock)
        await store.open()
        opened.append(store)
        return store

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    try:
        first = await new_store()
        yield Harness("sqlite", first, advance, new_store)
    finally:
        for store in opened:
            await store.close()


# -- PostgreSQL: a fresh database per test on the server in CONTEND_TEST_PG -------------------


@backend("postgres", marks=[pytest.mark.postgres])
@asynccontextmanager
async def postgres_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """A fresh database on the PostgreSQL server in ``CONTEND_TEST_PG`` (see
    ``contend.testing.postgres``); a fake clock, injected into every instance."""
    from contend.testing.postgres import NoServer, fresh_database

    clock = FakeClock()
    opened: list[Store] = []
    database = AsyncExitStack()
    try:
        url = await database.enter_async_context(fresh_database())
    except NoServer as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(f"{exc} (not under CI: there this is a failure)")

    async def new_store() -> Store:
        store = make_store(url, clock=clock)
        # A claim that has been slow (over 2 ms: a loaded machine) starts its walk at the
        # floor its instance learnt, and a task given back below it through another
        # instance, unheard, waits up to a second: by design (store/postgres/floors.py, tested
        # in tests/integration/postgres), but the model wants every claim's exact best task.
        store._db.use_floors = False  # type: ignore[attr-defined]
        await store.open()
        opened.append(store)
        return store

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    async with database:
        try:
            first = await new_store()
            yield Harness("postgres", first, advance, new_store)
        finally:
            for store in opened:
                await store.close()


# -- etcd: a real server, started once per test session -----------------------------------------

_etcd: EtcdServer | None = None


def _etcd_server() -> EtcdServer:
    """One etcd for the whole run, started on first use (a missing binary fails under CI=true,
    skips elsewhere) and stopped at exit."""
    global _etcd
    if _etcd is None:
        try:
            binary = find_etcd()
        except EtcdUnavailable as exc:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true and {exc}")
            pytest.skip(f"{exc} (not under CI: there this is a failure)")
        _etcd = EtcdServer(binary)
        _etcd.start()
        atexit.register(_etcd.close)
    return _etcd


@backend("etcd", marks=[pytest.mark.etcd])
@asynccontextmanager
async def etcd_harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """etcd's leases run on etcd's clock, never on a fake one. Each test gets a prefix of its own
    and a store on a fake clock (run_at, delays, reported deadlines); ``advance`` moves that
    clock and then revokes the lease of every session whose deadline it passed, which is what
    etcd does after that much real time. The TTL is long enough that no lease runs out by itself.

    Claims hang on the session's lease (``session_leases``): a claimed task's lease is its
    owner's session, renewed by its heartbeats and ended with it (deregistering revokes it).
    Waiting tasks age by the claim's reckoning (``ages_when_read``), not by expire()."""
    from contend.store.etcd import EtcdStore

    clock = FakeClock()
    url = f"{_etcd_server().url}/contract-{uuid.uuid4().hex[:12]}"
    opened: list[EtcdStore] = []

    async def new_store() -> Store:
        store = EtcdStore(url, clock=clock)
        await store.open()
        opened.append(store)
        return store

    async def advance(seconds: float) -> None:
        clock.advance(seconds)
        await lapse_overdue_sessions(opened[0], clock())

    try:
        first = await new_store()
        yield Harness(
            "etcd",
            first,
            advance,
            new_store,
            ttl=10.0,
            extra={"session_leases": True, "ages_when_read": True},
        )
    finally:
        for store in opened:
            await store.close()
