from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from contend.store.etcd import EtcdStore
from contend.testing.etcd_server import EtcdServer, EtcdUnavailable, find_etcd


def _binary() -> str:
    try:
        return find_etcd()
    except EtcdUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(f"{exc} (not under CI: there this is a failure)")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    server = EtcdServer(_binary())
    server.start()
    yield server
    server.close()


@pytest.fixture
def fresh_server() -> Iterator[EtcdServer]:
    """A server of its own, for tests that stop or kill it."""
    server = EtcdServer(_binary())
    server.start()
    yield server
    server.close()


@pytest.fixture
def store_url(etcd_server: EtcdServer) -> str:
    """A URL with a prefix of its own, so tests sharing the server never see each other."""
    return f"{etcd_server.url}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[EtcdStore]:
    s = EtcdStore(store_url, timeout=3.0)
    await s.open()
    yield s
    await s.close()
