"""The backends the contract suite runs on, registered in one place.

A backend is added by writing one factory and decorating it with :func:`backend`::

    @backend("postgres", marks=[pytest.mark.postgres])
    @asynccontextmanager
    async def postgres_harness(tmp_path: Path) -> AsyncIterator[Harness]:
        ...
        yield Harness(...)

The factory builds an *opened* store on a fresh, empty target, says how to move that store's
clock, how to open another independent instance on the same data, and cleans everything up
when the context exits. The pytest fixture (``conftest.py``) and the Hypothesis state machine
(``test_stateful.py``) both take their backends from :data:`BACKENDS`.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contend.store.port import Store
from contend.store.registry import make_store
from contend.testing import FakeClock
from contend.testing.etcd_server import (
    EtcdServer,
    EtcdUnavailable,
    find_etcd,
    lapse_overdue_sessions,
)


@dataclass
class Harness:
    """One backend under test.

    * ``store`` — opened, on an empty target.
    * ``advance(seconds)`` — move the store's clock forward (a fake clock where the backend
      takes one; a backend on a real clock may sleep).
    * ``new_store()`` — another independent, opened instance (connection, client) on the same
      data, closed by the harness; a backend with no such notion may return ``store`` itself.
    * ``ttl`` — the lease length the tests use; a real-clock backend may ask for a short one.
      Tests express their waits and delays in multiples of it where they can.
    * ``tolerance`` — how far (seconds) two readings of the store's clock taken around one call
      may differ; 0 for a fake clock, a little for a real one. ``at(t)`` compares with it.
    """

    name: str
    store: Store
    advance: Callable[[float], Awaitable[None]]
    new_store: Callable[[], Awaitable[Store]]
    ttl: float = 10.0
    tolerance: float = 1e-6
    extra: dict[str, Any] = field(default_factory=dict)

    def at(self, t: float) -> Any:
        """A time on the store's clock, compared with ``tolerance``: ``x == h.at(now + 5)``."""
        return pytest.approx(t, rel=0, abs=self.tolerance)


Factory = Callable[[Path], AbstractAsyncContextManager[Harness]]


@dataclass(frozen=True)
class Backend:
    name: str
    factory: Factory
    marks: tuple[pytest.MarkDecorator, ...] = ()
    fake_clock: bool = True  # the state machine jumps the clock a lot: fake clocks only


#: name -> backend; the fixture is parametrized over these, in this order.
BACKENDS: dict[str, Backend] = {}


def backend(
    name: str,
    *,
    marks: tuple[pytest.MarkDecorator, ...] | list[pytest.MarkDecorator] = (),
    fake_clock: bool = True,
) -> Callable[[Factory], Factory]:
    def register(factory: Factory) -> Factory:
        if name in BACKENDS:
            raise ValueError(f"backend {name!r} is registered twice")
        BACKENDS[name] = Backend(name, factory, tuple(marks), fake_clock)
        return factory

    return register


def backend_params(*, fake_clock_only: bool = False) -> list[Any]:
    """``pytest.param`` for every backend, with its marks and its name as the id."""
    return [
        pytest.param(b.name, marks=b.marks, id=b.name)
        for b in BACKENDS.values()
        if b.fake_clock or not fake_clock_only
    ]


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
