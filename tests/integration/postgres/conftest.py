"""Fixtures for the PostgreSQL store: each test gets a fresh database, dropped afterwards.

The server is found through ``CONTEND_TEST_PG`` (a URL without a database name, default
``postgresql://postgres@127.0.0.1:5432``). Under ``CI=true`` an unreachable server fails the
tests; elsewhere it skips them with a message saying how to provide one.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from contend.store.postgres import PostgresStore
from contend.testing import FakeClock
from contend.testing.pg_cluster import Cluster, ClusterUnavailable
from contend.testing.postgres import NoServer, fresh_database

StoreFactory = Callable[..., Awaitable[PostgresStore]]


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """The URL of a fresh, empty database."""
    try:
        async with fresh_database() as url:
            yield url
    except NoServer as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL is required under CI=true: {exc}")
        pytest.skip(f"{exc} (not under CI: there this is a failure)")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_store(pg_url: str) -> AsyncIterator[StoreFactory]:
    """Open stores on the test database; every one is closed at the end of the test."""
    opened: list[PostgresStore] = []

    async def make(url: str | None = None, **options: object) -> PostgresStore:
        store = PostgresStore(url or pg_url, **options)  # type: ignore[arg-type]
        await store.open()
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory, clock: FakeClock) -> PostgresStore:
    return await make_store(clock=clock)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL server of the test's own, which it may stop and restart (never
    the machine's own server)."""
    c = Cluster()
    try:
        c.start()
    except ClusterUnavailable as exc:
        c.close()
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(f"{exc} (not under CI: there this is a failure)")
    yield c
    c.close()
