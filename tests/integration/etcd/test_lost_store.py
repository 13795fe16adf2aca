"""etcd: the store an expert uses is gone under it — etcd killed and started again empty on the
same port, or the store's prefix deleted — and perhaps another store made at the same place
since. The expert must stop with a clear SchemaError within a few heartbeats and write nothing
into what is there now (before this, it wrote its session keys into the empty etcd, which the
next user then met as "holds keys that are not a contend store")."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from aetcd import rpc

from contend import Expert, SchemaError
from contend.store.etcd import EtcdStore
from contend.testing.etcd_server import EtcdServer
from tests.integration.lease_faults import HEARTBEAT, LEASE, SideEffects, make_app, until

pytestmark = pytest.mark.etcd

#: The expert must have stopped this long after the store came back empty (a few heartbeats).
STOP_WITHIN = LEASE + 2 * HEARTBEAT


async def _keys(server: EtcdServer) -> list[bytes]:
    """Every key in the cluster."""
    store = EtcdStore(server.url)
    store._etcd.connect()
    try:
        resp = await store._etcd.range(b"\0", b"\0", keys_only=True)
        return [kv.key for kv in resp.kvs]
    finally:
        await store._etcd.close()


async def _leases(server: EtcdServer) -> list[int]:
    store = EtcdStore(server.url)
    store._etcd.connect()
    try:
        resp = await store._etcd.lease.LeaseLeases(rpc.LeaseLeasesRequest(), timeout=5)
        return [int(lease.ID) for lease in resp.leases]
    finally:
        await store._etcd.close()


def _wipe(server: EtcdServer) -> None:
    """Kill etcd, delete its data, start it again on the same ports: an empty etcd."""
    server.kill()
    shutil.rmtree(Path(server.data_dir) / "data")
    server.start()


@pytest.mark.parametrize("then", ["left empty", "a new store made there"])
async def test_an_expert_whose_etcd_came_back_empty_stops_and_writes_nothing(
    fresh_server: EtcdServer, then: str
) -> None:
    url = f"{fresh_server.url}/lost"
    effects = SideEffects()
    app = make_app(url, effects)
    e = Expert(app, name="a", lease_ttl=LEASE, concurrency=1)
    runner = asyncio.create_task(e.run())
    try:
        await app.submit("work", [60.0])
        await until(lambda: effects.started("a"), 10, "the first run")
        await asyncio.to_thread(_wipe, fresh_server)
        back = time.monotonic()
        before: list[bytes] = []
        if then == "a new store made there":
            new = EtcdStore(url)
            await new.open()  # writes the new store's meta key, nothing else
            await new.close()
            before = await _keys(fresh_server)
            assert before == [b"lost/meta"]
        with pytest.raises(SchemaError, match="lost its data"):
            await asyncio.wait_for(runner, STOP_WITHIN + 10)
        took = time.monotonic() - back
        print(f"\netcd wiped ({then}): the expert stopped {took:.2f}s after etcd was back")
        assert took <= STOP_WITHIN, f"went on for {took:.2f}s"
        assert effects.stopped("a") is not None
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await app.aclose()
    assert await _keys(fresh_server) == before  # not a key of the expert's
    assert await _leases(fresh_server) == []  # and no lease granted to it left behind


async def test_an_expert_whose_prefix_was_deleted_stops_and_writes_nothing(
    etcd_server: EtcdServer, store_url: str
) -> None:
    effects = SideEffects()
    app = make_app(store_url, effects)
    e = Expert(app, name="a", lease_ttl=LEASE, concurrency=1)
    runner = asyncio.create_task(e.run())
    prefix = (store_url.rsplit("/", 1)[1] + "/").encode()
    try:
        await app.submit("work", [60.0])
        await until(lambda: effects.started("a"), 10, "the first run")
        store = await app.store()
        assert isinstance(store, EtcdStore)
        await store._etcd.kv.DeleteRange(
            rpc.DeleteRangeRequest(key=prefix, range_end=prefix[:-1] + b"0"), timeout=5
        )
        at = time.monotonic()
        with pytest.raises(SchemaError, match="lost its data"):
            await asyncio.wait_for(runner, STOP_WITHIN + 10)
        took = time.monotonic() - at
        print(f"\netcd prefix deleted: the expert stopped after {took:.2f}s")
        assert took <= STOP_WITHIN, f"went on for {took:.2f}s"
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await app.aclose()
    left = [k for k in await _keys(etcd_server) if k.startswith(prefix)]
    assert left == []
