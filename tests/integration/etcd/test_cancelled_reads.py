"""etcd 3.5.0 to 3.5.4 panic when a read-only transaction is cancelled while the server walks
its keys (etcd-io/etcd#14110): an expert killed mid-read, or a read that timed out, took the
whole server down in the chaos suite. contend reads with plain ranges on those versions."""

from __future__ import annotations

import time

from contend.errors import StoreError
from contend.store.etcd import EtcdStore
from contend.store.etcd.rpc import read_txn_crashes
from contend.store.etcd.txn import put
from contend.testing.etcd_server import EtcdServer


def test_the_versions_with_the_crash_are_known() -> None:
    assert read_txn_crashes("3.5.1") and read_txn_crashes("3.5.4")
    assert not read_txn_crashes("3.5.5")
    assert not read_txn_crashes("3.4.23")
    assert not read_txn_crashes("3.6.0")
    assert not read_txn_crashes("v?")


async def test_reads_cut_off_mid_walk_leave_the_server_running(fresh_server: EtcdServer) -> None:
    store = EtcdStore(f"{fresh_server.url}/cut", timeout=3.0)
    await store.open()
    etcd = store._etcd
    try:
        keys = [b"/cut/x/%05d" % i for i in range(96)]
        for i in range(0, len(keys), 32):
            await etcd.txn([], [put(k, b"v" * 2000) for k in keys[i : i + 32]])
        assert [kv.key for kv in await etcd.read_many(keys)] == keys
        crashes = read_txn_crashes(etcd.version)
        assert etcd.read_txns is not crashes
        etcd.timeout = 0.0005  # every read is cut off by its deadline, most of them mid-walk
        cut = 0
        began = time.monotonic()
        while cut < 300 and time.monotonic() - began < 30:
            try:
                await etcd.read_many(keys)
            except StoreError:
                cut += 1
            assert fresh_server.proc is not None
            assert fresh_server.proc.poll() is None, f"etcd died: {fresh_server.log_tail(400)}"
        assert cut >= 100, f"only {cut} reads were cut off: the deadline did not bite"
        etcd.timeout = 3.0
        assert [kv.key for kv in await etcd.read_many(keys)] == keys
    finally:
        await store.close()
