"""The connection to etcd and the calls every part of the store makes through it: one
transaction, a write safe against a lost reply, a range, a count, a paged scan, a batch of
point reads. Every error becomes a StoreError that names the endpoint.

Every write transaction also compares the store's meta key with the value it had when the store
was opened (:attr:`Etcd.guard`): an etcd emptied or replaced under a running expert (killed and
started again without its data, the prefix deleted, another store made there since) fails the
compare, nothing is written, and :class:`~contend.errors.SchemaError` says why."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aetcd import rpc

from contend.errors import SchemaError, StoreError, StoreUnavailable
from contend.store.etcd.keys import prefix_end
from contend.store.etcd.txn import GET, PUT, Op, build, get, one_entry_per_level, value_is

T = TypeVar("T")

# gRPC reconnects with exponential back-off up to two minutes by default; an etcd restart should
# be noticed within seconds.
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
)


log = logging.getLogger("contend.store.etcd")
_WARNED: set[tuple[str, int]] = set()  # servers this process warned about (once each)


def read_txn_crashes(version: str) -> bool:
    """Whether etcd *version* panics on a read-only transaction cancelled mid-read: 3.5.0
    passed the request's context down to the key walk and 3.5.5 fixed it (etcd-io/etcd#14110).
    An unreadable version counts as sound."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if m is None:
        return False
    major, minor, patch = (int(x) for x in m.groups())
    return (major, minor) == (3, 5) and patch < 5


class Etcd:
    """One gRPC channel to an etcd server and its KV, Lease and Watch stubs. *tasks* is the
    prefix of the task records (``{p}t/``), by which commit() recognises its own write; *meta*
    the store's meta key, which every write compares with :attr:`guard`."""

    def __init__(
        self, host: str, port: int, timeout: float, max_ops: int, tasks: bytes, meta: bytes
    ) -> None:
        self.host, self.port = host, port
        self.timeout = timeout
        # The compares and operations a caller's transaction may carry (--max-txn-ops), less
        # the compare of the guard.
        self.max_ops = max_ops - 1
        self._tasks = tasks
        self.meta = meta
        #: The meta key's value as the store was opened (None until then): a write lands only
        #: while it is still there.
        self.guard: bytes | None = None
        self.channel: Any = None
        self.kv: Any = None
        self.lease: Any = None
        self.watch: Any = None
        self.rev = 0  # the highest etcd revision this instance has seen
        #: Whether a read-only transaction is safe on this server (see :meth:`reads`).
        self.read_txns = True
        self.version = ""  # the server's version, as its status says

    def connect(self) -> None:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        self.channel = rpc.insecure_channel(f"{host}:{self.port}", options=CHANNEL_OPTIONS)
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)

    async def close(self) -> None:
        if self.channel is not None:
            channel, self.channel = self.channel, None
            await channel.close()

    def where(self) -> str:
        return f"etcd at {self.host}:{self.port}"

    async def call(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        if self.channel is None:
            raise StoreError("the etcd store is not open (call await store.open())")
        try:
            return await make()
        except rpc.AioRpcError as exc:
            code = exc.code()
            if code == rpc.StatusCode.UNAVAILABLE:
                raise StoreUnavailable(
                    f"cannot reach {self.where()} ({what}): {exc.details()}; is etcd running?"
                ) from exc
            if code == rpc.StatusCode.DEADLINE_EXCEEDED:
                raise StoreUnavailable(
                    f"{self.where()} did not answer {what} within {self.timeout:g}s"
                ) from exc
            raise StoreError(
                f"{self.where()} refused {what}: {code.name}: {exc.details()}"
            ) from exc

    async def txn(
        self, compare: Sequence[Op], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> Any:
        if len(success) > 2:
            success = one_entry_per_level(success)
        guard = self.guard
        guarded = guard is not None and any(op[0] != GET for op in success)
        if guarded:
            assert guard is not None
            compare = [*compare, value_is(self.meta, guard)]
            failure = [*failure, get(self.meta)]
        req = build(compare, success, failure)
        resp = await self.call("a transaction", lambda: self.kv.Txn(req, timeout=self.timeout))
        self.rev = max(self.rev, resp.header.revision)
        if guarded and not resp.succeeded:
            kvs = resp.responses[-1].response_range.kvs
            if not kvs or kvs[0].value != guard:
                raise self.lost(found=bool(kvs))
            del resp.responses[-1]  # the guard's read: callers see the failure reads they asked
        return resp

    def lost(self, *, found: bool) -> SchemaError:
        """The error of a write refused because the store opened is no longer there."""
        what = "belongs to another store now" if found else "is gone"
        return SchemaError(
            f"the contend store at {self.where()} lost its data (its meta key "
            f"{self.meta.decode()!r} {what}: etcd emptied or replaced, or the prefix "
            "deleted); nothing was written"
        )

    async def commit(
        self, compare: Sequence[Op], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> Any | None:
        """A write transaction that puts a task record, safe against a lost reply: when the
        call fails, the record is read back, and if it holds exactly the value this write put
        (every record carries the writer's timestamp and history), the write landed and None
        is returned. Otherwise the error stands: the outcome is unknown."""
        try:
            return await self.txn(compare, success, failure)
        except SchemaError:
            raise
        except StoreError:
            tasks = self._tasks
            task_puts = [op for op in success if op[0] == PUT and op[1].startswith(tasks)]
            if not task_puts:
                raise
            try:
                kv = (await self.read_many([task_puts[0][1]]))[0]
            except StoreError:
                kv = None
            if kv is not None and kv.value == task_puts[0][2]:
                return None
            raise

    async def range(
        self, key: bytes, end: bytes | None = None, *, limit: int = 0, keys_only: bool = False
    ) -> Any:
        req = rpc.RangeRequest(key=key, limit=limit, keys_only=keys_only)
        if end is not None:
            req.range_end = end
        resp = await self.call("a read", lambda: self.kv.Range(req, timeout=self.timeout))
        self.rev = max(self.rev, resp.header.revision)
        return resp

    async def count(self, key: bytes, end: bytes) -> int:
        req = rpc.RangeRequest(key=key, range_end=end, count_only=True)
        resp = await self.call("a count", lambda: self.kv.Range(req, timeout=self.timeout))
        return int(resp.count)

    async def counts(self, prefixes: Sequence[bytes]) -> list[tuple[int, int]]:
        """(keys under it, the revision they were counted at) for each of *prefixes*: one
        read-only transaction per ``max_ops`` of them where the server is sound, else a
        plain count range each, at once (no pinned revision: each range's own revision is
        the one it counted at)."""
        ops = [get(p, prefix=True, count_only=True) for p in prefixes]
        if not self.read_txns:
            got = await asyncio.gather(*(self._range_op(op, 0) for op in ops))
            return [(int(r.count), int(r.header.revision)) for r in got]
        out: list[tuple[int, int]] = []
        for i in range(0, len(ops), self.max_ops):
            resp = await self.txn([], ops[i : i + self.max_ops])
            rev = int(resp.header.revision)
            out += [(int(r.response_range.count), rev) for r in resp.responses]
        return out

    async def scan(self, prefix: bytes, *, keys_only: bool = False, page: int = 1000) -> list[Any]:
        """Every key under *prefix*, in key order, read in pages."""
        out: list[Any] = []
        start, end = prefix, prefix_end(prefix)
        while True:
            resp = await self.range(start, end, limit=page, keys_only=keys_only)
            out.extend(resp.kvs)
            if not resp.more or not resp.kvs:
                return out
            start = resp.kvs[-1].key + b"\0"

    async def check_server(self) -> None:
        """Read the server's version; on one whose read-only transactions can crash it, read
        with plain ranges instead and say so once (:meth:`reads`)."""
        maintenance = rpc.MaintenanceStub(self.channel)
        status = await self.call(
            "a status", lambda: maintenance.Status(rpc.StatusRequest(), timeout=self.timeout)
        )
        self.version = str(status.version)
        self.read_txns = not read_txn_crashes(self.version)
        if not self.read_txns and (self.host, self.port) not in _WARNED:
            _WARNED.add((self.host, self.port))
            log.warning(
                "etcd %s at %s:%s can crash when a client goes away during a read-only "
                "transaction (etcd-io/etcd#14110, fixed in 3.5.5); contend reads key by key "
                "there, which costs more round trips: upgrade etcd",
                self.version,
                self.host,
                self.port,
            )

    async def reads(self, ops: Sequence[Op]) -> list[Any]:
        """Several reads (GET operations) of one snapshot; returns a RangeResponse each.

        One read-only transaction where the server is sound. On etcd 3.5.0 to 3.5.4 a
        read-only transaction cancelled while the server walks its keys (the client timed
        out, or its process died) panics the whole server (etcd-io/etcd#14110), so there the
        first read is a plain range and the others read at its revision, all at once."""
        if not ops:
            return []
        if self.read_txns or len(ops) == 1:
            if len(ops) == 1:
                return [await self._range_op(ops[0], 0)]
            resp = await self.txn([], ops)
            return [r.response_range for r in resp.responses]
        first = await self._range_op(ops[0], 0)
        at = int(first.header.revision)
        rest = await asyncio.gather(*(self._range_op(op, at) for op in ops[1:]))
        return [first, *rest]

    async def _range_op(self, op: Op, revision: int) -> Any:
        _, key, end, keys_only, count_only, limit = op
        req = rpc.RangeRequest(
            key=key, keys_only=keys_only, count_only=count_only, limit=limit, revision=revision
        )
        if end:
            req.range_end = end
        resp = await self.call("a read", lambda: self.kv.Range(req, timeout=self.timeout))
        self.rev = max(self.rev, resp.header.revision)
        return resp

    async def read_many(self, keys: Sequence[bytes]) -> list[Any]:
        """Read several keys of one snapshot; returns the KeyValue or None for each."""
        out: list[Any] = []
        for i in range(0, len(keys), self.max_ops):
            chunk = keys[i : i + self.max_ops]
            out.extend(
                r.kvs[0] if r.kvs else None for r in await self.reads([get(k) for k in chunk])
            )
        return out
