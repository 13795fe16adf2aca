"""The etcd v3 store: many hosts share one etcd cluster; a claim is one etcd transaction.

URL: ``etcd://host:port`` or ``etcd://host:port/prefix`` (every key lives under ``prefix/``,
default ``contend/``). Options, in the URL's query (``etcd://host:2379/app?max_txn_ops=1024``)
or as keyword arguments: ``timeout`` (seconds per RPC, default 5), ``max_txn_ops`` (the
cluster's ``--max-txn-ops``, default 128: how many operations one transaction may carry) and
``compact_after`` (seconds of etcd history that ``expire()`` keeps, compacting the rest, default
60; 0: never, for a cluster whose operator compacts it).

Key layout (``{p}`` is the prefix; ids, queue names and expert ids are percent-encoded so that
a ``/`` in a name can never be read as a separator)::

    {p}meta                       {"schema": 4}; written once by the first open()
    {p}t/{task}                   the task record: a JSON array of _Rec's fields
    {p}d/{task}/args              [args, kwargs]          written once at submit
    {p}d/{task}/result            the result JSON         written by complete()
    {p}d/{task}/checkpoint        the checkpoint JSON     written by checkpoint()
                                  (args and result of up to INLINE_MAX characters travel in
                                  the task record instead, which saves a key per task)
    {p}q/{queue}/{inv}/{due}/{task}
                                  the priority index: one key per pending task. {inv} is
                                  10_000_000 - priority on 8 digits and {due} the due time in
                                  microseconds on 17 digits, so a range read of q/{queue}/{inv}/
                                  yields one priority's tasks first in, first out (and the
                                  heads of all levels are a queue's longest waiting). The
                                  value, "{created_at} {"type", "req"}", holds what a scorer
                                  needs.
    {p}v/{queue}/{inv}            a priority level that may hold pending tasks, put by every
                                  task entering it and dropped by expire() once it is empty.
                                  Its value is the level's floor, a "{due}/{task}" no pending
                                  task of the level stands below: an entering task lowers it
                                  to its own place if need be, a claim raises it past the
                                  tasks it took (see "Floors" below)
    {p}c/{task}                   the claim: {"expert", "session", "fence"}, attached to the
                                  owner's etcd lease, so it vanishes when that lease ends
    {p}a/{expert}/{task}          "{fence} {session}", no lease: every claimed/running task,
                                  under its owner; when a session has ended, expire() returns
                                  the tasks its a/ keys name (their c/ keys vanished with it)
    {p}x/{expert}/{session}       a session that may hold claims: written with its l/ key,
                                  deleted by expire() once the session has ended and its
                                  tasks are returned. renew() lists the c/ keys on the lease.
    {p}k/{idempotency key}        the task id the key was first used for
    {p}w/{dependency}/{task}      an edge: task waits for dependency
    {p}s/{task}                   the task ended and its waiters still have to be told; the
                                  marker is written in the same transaction as the ending, so a
                                  crash before the waiters are settled is repaired by expire()
    {p}e/{expert}                 the expert's record: info, session, counters (outlives it)
    {p}l/{expert}                 the live session, on the expert's lease: {"session", "lease"}
    {p}u/{task}                   an auction: {"closes_at"}, written by the first bid
    {p}b/{task}/{expert}          a bid: {"score", "at"}. Bids outlive their bidder (the grace
                                  period lets the next bidder claim); expire() drops the
                                  auctions and bids of tasks that are no longer pending.
    {p}leader/{queue}             reserved for central-dispatch leader election
    {p}compacted                  when an instance last compacted etcd's history (its clock)

Ageing is computed when claims read, not written: a claim reads the head of each priority
level of a queue (``v/`` lists them) and ranks what it read by effective priority (priority
plus the age term, domain.aged_priority, from the created_at in the index value), then due
time, then id. So a waiting task's keys never move: no rewrite of every pending task as it
ages. Within a level only the head is read: among tasks of one priority, one due later but
created earlier (a delayed task) ranks first only once it is within a page of the head.

Floors: etcd keeps a deleted key in its index until the history is compacted, and a range
read walks every such key in its range; a claim that read each level from its beginning would
walk every task ever claimed since the last compaction (40 ms per claim after 50,000 tasks).
So each read of a level starts at the level's floor, and a claim transaction raises the floor
past the tasks it took at the head of the level, in a nested transaction that compares the
level key's ``mod_revision`` with the one v/ listed before the claim read the level: every
entering task puts the level key, so the raise lands only if no task entered since the read,
and everything below the new floor was read and taken. An entering task's nested transaction
lowers the floor to its place when it stands below it (a released task, a host whose clock is
behind) and touches the key otherwise (``ignore_value``).

A claim compares, for each task, the task key's ``mod_revision`` with the one read (the task
was pending then, and a pending task has no ``c/{task}``: every end of an ownership deletes
it in the same transaction, or it vanished with its lease), and that the expert's session key
still holds its session; then for each task it puts the task (fence + 1, attempts + 1), puts
``c/`` on the expert's lease, puts ``a/`` and deletes the index key, and it raises the floors.
The tasks of one claim share a ``Txn`` (as many as ``max_txn_ops`` allows); when a rival took
some of them, one read tells which, and the others are claimed together in the next ``Txn``. The fence is a
counter in the task record, not the etcd revision: it is the number every other backend
reports (one more per claim), it survives a restore from a snapshot, and it is small enough to
hand to external systems. Every owner write reads the task and its claim, checks fence, owner,
state and claim, and commits with a Txn comparing both ``mod_revision`` values; a claim key
that vanished with its lease makes the write fail as ``FencedOut("the lease lapsed")``. The
writes of one batch (``complete``, ``fail``, ``start``, ``release``) share a Txn in the same
way, and fall back to one Txn per task when any of them moved.

Leases: one etcd lease per expert session. ``register_expert`` grants it; ``renew`` sends one
keep-alive on a long-lived ``LeaseKeepAlive`` stream (aetcd's ``refresh()`` opens a new stream
per call) and refreshes the expert record. The store never keeps a lease alive on its own: the
expert's heartbeat is the liveness signal, so a stalled expert loses its lease. etcd's TTL is
the truth; the lease deadlines this store reports (heartbeat time + TTL) are approximations.
etcd leases have whole-second TTLs (rounded up here) and etcd may extend a lease on a leader
change, so the fence and the claim key, compared in every write, are the safety net.

Clocks: etcd has no time API, so ``now()``, ``created_at`` and ``run_at`` come from the client
host's clock. They decide only when delayed tasks fall due and what is displayed; ownership never
depends on them (it depends on etcd leases and revisions).

Reads of a priority level stop at a bound a learned span past the further of the floor and
where the last read of it ended (``_Window``), because etcd counts every key in a read's range
whatever its limit; only when fewer than a page of keys lie before the bound does the read go
on to the end of the level.

Limits: a submission larger than one transaction (``max_txn_ops``) is written in several
transactions; every check (unknown dependency, cycle) runs before the first one, so a refused
submission writes nothing, but an etcd failure between two of them leaves the earlier tasks in.
etcd's default request limit (1.5 MiB) caps the size of one payload.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import math
import operator
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import orjson
from aetcd import rpc

from contend.domain.scoring import TaskView
from contend.domain.task import (
    JSON,
    Capabilities,
    Requirements,
    Task,
    TaskEvent,
    TaskSpec,
    TaskState,
    aged_priority,
    can_move,
)
from contend.errors import (
    ConfigError,
    ExpertConflict,
    FencedOut,
    InvalidTransition,
    LeaseLost,
    SchemaError,
    StoreError,
    TaskNotFound,
)
from contend.store._common import (
    after_failure,
    check_batch_dependencies,
    check_bid,
    check_limit,
    check_retry_delay,
    check_ttl,
    initial_state,
    rank_bids,
)
from contend.store.port import (
    Auction,
    Backlog,
    Claimed,
    Completion,
    ExpertInfo,
    ExpertRecord,
    Failure,
    Heartbeat,
    StoreStats,
    Submitted,
)

T = TypeVar("T")

SCHEMA_VERSION = 4  # 4: v/ holds floors, no o/ index; 3: records are arrays, q/ by priority
#: Keep at most this many history events in a task record (it is rewritten at every change).
HISTORY_LIMIT = 50
#: How many times an owner write re-reads and retries when the task changed under it.
WRITE_RETRIES = 20
#: Priorities are stored as PRIORITY_BASE − priority on 8 digits (a range read then yields
#: the highest first); priorities are within ±1,000,000.
PRIORITY_BASE = 10_000_000
#: The most operations one task's claim puts in a transaction (3 puts, the index delete).
CLAIM_OPS = 4
#: The most priority levels whose floor one claim transaction raises.
RISE_OPS = 8
#: What the compact JSON of an index value holds for "no requirements": no need to parse it.
_REQ_NONE = b'"req":null'
#: A spreading claim reads this many times as many candidates as it wants, and takes a stripe.
SPREAD_DEPTH = 6
#: After a rival wins one of its claim batches, an instance spreads its claims this many seconds.
CONTENDED_FOR = 2.0
#: Payloads up to this many characters are kept in the task record, not in a d/ key of their own.
INLINE_MAX = 1024
#: How many claimed tasks' keys one store instance remembers, to write them without a read.
OWNED_CACHE = 16_384
#: How many read windows (one per priority level) an instance keeps.
WINDOW_CACHE = 4096
#: How many sessions' lease ids and records one store instance keeps cached.
SESSION_CACHE = 256
#: expire() looks for priority levels left empty this often (seconds, store clock).
LEVEL_SWEEP = 60.0
#: Expert records whose session ended this long ago are removed by expire().
EXPERT_RETENTION = 3600.0

P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING
_OWNED = frozenset({C, R})

# gRPC reconnects with exponential back-off up to two minutes by default; an etcd restart should
# be noticed within seconds.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
)


def parse_etcd_url(url: str) -> tuple[str, int, str]:
    """``etcd://host:port[/prefix][?options]`` -> (host, port, key prefix ending in ``/``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"malformed etcd URL {url!r}: {exc}") from exc
    if parts.scheme != "etcd":
        raise ConfigError(f"not an etcd URL: {url!r}")
    if not parts.hostname:
        raise ConfigError(f"etcd URL {url!r} names no host; write etcd://host:2379")
    if parts.fragment or parts.username or parts.password:
        raise ConfigError(f"etcd URL {url!r}: fragments and credentials are not supported")
    prefix = parts.path.strip("/")
    if any(not seg for seg in prefix.split("/")) and prefix:
        raise ConfigError(f"etcd URL {url!r}: the key prefix has an empty segment")
    return parts.hostname, port or 2379, (prefix or "contend") + "/"


#: Options an etcd URL may carry (``?max_txn_ops=1024&timeout=10``), with their parsers.
URL_OPTIONS: dict[str, Callable[[str], float | int]] = {
    "timeout": float,
    "max_txn_ops": int,
    "compact_after": float,
}
#: Seconds of etcd history kept by default: older revisions are compacted by expire().
COMPACT_AFTER = 60.0


def etcd_url_options(url: str) -> dict[str, float | int]:
    """The options in an etcd URL's query; ConfigError for an unknown or malformed one."""
    out: dict[str, float | int] = {}
    query = urlsplit(url).query
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ConfigError(f"etcd URL {url!r}: malformed options ({exc})") from exc
    for name, value in pairs:
        parse = URL_OPTIONS.get(name)
        if parse is None:
            known = ", ".join(URL_OPTIONS)
            raise ConfigError(f"etcd URL {url!r}: unknown option {name!r} (known: {known})")
        if name in out:
            raise ConfigError(f"etcd URL {url!r}: option {name!r} given twice")
        try:
            out[name] = parse(value)
        except ValueError as exc:
            raise ConfigError(f"etcd URL {url!r}: option {name}={value!r} is not a number") from exc
    return out


@functools.lru_cache(maxsize=8192)
def _enc(name: str) -> str:
    return quote(name, safe="")


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with *prefix*."""
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


def _one_entry_per_level(ops: Sequence[_Op]) -> list[_Op]:
    """*ops* with the entries (ENTER) of one priority level made one, at the lowest position:
    etcd refuses a key put twice in a transaction."""
    at: dict[bytes, int] = {}  # level key -> where its entry is in *out*
    out: list[_Op] = []
    for op in ops:
        if op[0] == ENTER:
            i = at.get(op[1])
            if i is not None:
                if op[2] < out[i][2]:
                    out[i] = op
                continue
            at[op[1]] = len(out)
        out.append(op)
    return out


_RankT = tuple[int, str, str]


def _index_json(value: bytes) -> dict[str, Any]:
    """The JSON part of a priority-index value (after the creation time)."""
    parsed: dict[str, Any] = json.loads(value[value.index(b" ") + 1 :])
    return parsed


def _any(kv: Any) -> bool:
    return True


def _micros(t: float) -> int:
    return max(0, round(t * 1_000_000))


def _error_json(kind: str, message: str) -> str:
    return json.dumps({"type": kind, "message": message})


def _load(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


# -- request builders ----------------------------------------------------------------------
# Operations and compares are plain tuples, written into a TxnRequest in place by _build: five
# times cheaper than making each protobuf message and having the request copy it. An
# operation is (PUT, key, value, lease), (DELETE, key, range end or b"") or (GET, key, range
# end or b"", keys_only, count_only, limit), (ENTER, level key, position) or (RAISE, level
# key, revision, position) (both nested transactions on a priority level's floor); a compare
# is (MOD_IS, key, revision), (ABSENT, key), (PRESENT, key) or (VALUE_IS, key, value).
PUT, DELETE, GET, ENTER, RAISE = 0, 1, 2, 3, 4
MOD_IS, ABSENT, PRESENT, VALUE_IS = 0, 1, 2, 3
_Op = tuple[Any, ...]


def _put(key: bytes, value: bytes | str, lease: int = 0) -> _Op:
    return (PUT, key, value.encode() if isinstance(value, str) else value, lease)


def _delete(key: bytes, *, prefix: bool = False, end: bytes = b"") -> _Op:
    return (DELETE, key, _prefix_end(key) if prefix else end)


def _get(
    key: bytes,
    *,
    prefix: bool = False,
    end: bytes = b"",
    keys_only: bool = False,
    count_only: bool = False,
    limit: int = 0,
) -> _Op:
    return (GET, key, _prefix_end(key) if prefix else end, keys_only, count_only, limit)


def _enter(level: bytes, position: bytes) -> _Op:
    """A task enters a priority level at *position*: the level's floor (the value of its v/
    key) comes down to *position* if it was above it, and the key is put either way, so that
    its revision tells a claim that tasks entered since it read."""
    return (ENTER, level, position)


def _raise(level: bytes, revision: int, position: bytes) -> _Op:
    """Move a level's floor up to *position*, if its key is still at *revision*."""
    return (RAISE, level, revision, position)


def _mod_is(key: bytes, revision: int) -> _Op:
    return (MOD_IS, key, revision)


def _absent(key: bytes) -> _Op:
    return (ABSENT, key)


def _present(key: bytes) -> _Op:
    return (PRESENT, key)


def _value_is(key: bytes, value: bytes) -> _Op:
    return (VALUE_IS, key, value)


def _build(compare: Sequence[_Op], success: Sequence[_Op], failure: Sequence[_Op]) -> Any:
    """The TxnRequest of these compares and operations."""
    req = rpc.TxnRequest()
    add = req.compare.add
    for c in compare:
        m = add()
        m.key = c[1]
        kind = c[0]
        if kind == MOD_IS:
            m.target = rpc.Compare.MOD
            m.mod_revision = c[2]
        elif kind == VALUE_IS:
            m.target = rpc.Compare.VALUE
            m.value = c[2]
        else:  # the version: 0 for an absent key
            m.target = rpc.Compare.VERSION
            m.version = 0  # set even though 0: it selects the compare's target field
            if kind == PRESENT:
                m.result = rpc.Compare.GREATER
    for ops, into in ((success, req.success), (failure, req.failure)):
        add = into.add
        for op in ops:
            kind = op[0]
            if kind == PUT:
                put = add().request_put
                put.key = op[1]
                put.value = op[2]
                if op[3]:
                    put.lease = op[3]
            elif kind == DELETE:
                d = add().request_delete_range
                d.key = op[1]
                if op[2]:
                    d.range_end = op[2]
            elif kind == ENTER:  # if floor <= position: touch the key, else floor = position
                t = add().request_txn
                c = t.compare.add()
                c.key = op[1]
                c.target = rpc.Compare.VALUE
                c.result = rpc.Compare.LESS  # floor < position + NUL: floor <= position
                c.value = op[2] + b"\0"
                touch = t.success.add().request_put
                touch.key = op[1]
                touch.ignore_value = True
                low = t.failure.add().request_put  # also when the key is absent
                low.key = op[1]
                low.value = op[2]
            elif kind == RAISE:
                t = add().request_txn
                c = t.compare.add()
                c.key = op[1]
                c.target = rpc.Compare.MOD
                c.mod_revision = op[2]
                up = t.success.add().request_put
                up.key = op[1]
                up.value = op[3]
            else:
                r = add().request_range
                r.key = op[1]
                if op[2]:
                    r.range_end = op[2]
                r.keys_only, r.count_only, r.limit = op[3], op[4], op[5]
    return req


@dataclass(slots=True)
class _KV:
    """A key as this instance wrote it (stands in for an etcd KeyValue it did not read)."""

    key: bytes
    value: bytes
    mod_revision: int


_COMPACT = json.JSONEncoder(separators=(",", ":"))


@dataclass(slots=True)
class _Rec:
    """A task record as stored under ``t/{id}``: a JSON array of these fields in this order
    (half the size of an object, and parsed in half the time). A field added later goes last,
    with a default, so that shorter arrays still read."""

    id: str
    type: str
    queue: str
    state: str
    priority: int
    key: str | None
    req: JSON
    attempts: int
    max_attempts: int
    fence: int
    owner: str | None
    session: str | None  # the owner's session: its claims end with it
    lease_deadline: float | None
    run_at: float
    created_at: float
    updated_at: float
    timeout: float | None
    error: str | None
    depends_on: list[str]
    deps_left: int
    has_waiters: bool
    indexed: bool  # its key is in the priority index (made from the record)
    history: list[list[Any]]
    # Small payloads travel in the record (one key less to write and read per task); a payload
    # larger than INLINE_MAX, and every payload of a record written before, lives under d/.
    args: str | None = None  # "[args, kwargs]" JSON text
    result: str | None = None  # the result JSON text, once succeeded
    checkpointed: bool | None = None  # a d/{id}/checkpoint exists (None: not known, look)

    def dumps(self) -> bytes:
        # orjson writes and reads a record four to seven times as fast as the json module;
        # json takes what orjson refuses (an integer beyond 64 bits in a requirement).
        fields = _rec_fields(self)
        try:
            return orjson.dumps(fields)
        except TypeError:
            return _COMPACT.encode(fields).encode()

    @classmethod
    def loads(cls, data: bytes) -> _Rec:
        try:
            return cls(*orjson.loads(data))
        except orjson.JSONDecodeError:
            return cls(*json.loads(data))

    def event(self, now: float, event: str, expert: str | None, detail: str | None = None) -> None:
        self.history.append([now, event, self.fence, expert, detail])
        if len(self.history) > HISTORY_LIMIT:
            del self.history[1 : len(self.history) - HISTORY_LIMIT + 1]


_rec_fields = operator.attrgetter(*_Rec.__slots__)

_ID_BITS = 112  # task ids are 28 hex digits: 112 bits


@dataclass(slots=True)
class _Window:
    """Where the next read of one index level may stop: *span* positions (``_position``) past
    the further of where it starts and *last*, the last key the previous read reached (so the
    keys that read saw and left are in the window, whatever lies between batches). *span* is
    adapted so that a window holds a page or a few: doubled when a read ran past the bound,
    halved when it held many pages."""

    last: bytes  # the whole key, prefix included
    span: int

    def segments(self, prefix: bytes, start: bytes, end: bytes) -> list[tuple[bytes, bytes]]:
        """The ranges to read in turn: from *start* up to the bound, then on to *end*."""
        base = max(start, self.last)[len(prefix) :]
        due, tid = divmod(_position(base) + self.span, 1 << _ID_BITS)
        bound = prefix + f"{due:017d}/{tid:028x}".encode()
        if due >= 10**17 or not start < bound < end:
            return [(start, end)]
        return [(start, bound), (bound, end)]

    @staticmethod
    def after(
        window: _Window | None,
        skip: int,
        start: bytes,
        last: bytes,
        spilled: bool,
        count: int,
        page: int,
        full: bool,
    ) -> _Window | None:
        """The window for the next read, from how this one went: it read from *start* up to
        *last*; *spilled*: it had to read past the bound; *count*: the keys its first range
        held; *full*: it found all it wanted."""
        if not last or not full:
            return None  # the whole index was read and held too few: no bound needed
        width = max(1, _position(last[skip:]) - _position(start[skip:]))
        if window is None:
            return _Window(last, 2 * width)  # keys lie unevenly: ids cluster by millisecond
        span = window.span
        if spilled:
            span = max(4 * span, width)
        elif count > 4 * page:
            span = max(1, span // 2)
        return _Window(last, span)


def _position(spot: bytes) -> int:
    """A place within a priority level as a number: ``{due}/{id}`` -> due << 112 | id, the id
    read as hex where it is 28 hex digits (contend's own ids) and as 0 otherwise."""
    try:
        due = int(spot[:17])
    except ValueError:
        return 0
    tid = spot[18:46]
    try:
        num = int(tid, 16) if len(tid) == 28 else 0
    except ValueError:
        num = 0
    return (due << _ID_BITS) | num


@dataclass(slots=True)
class _LevelRead:
    """One read of a priority level's tasks by a claim: what it needs to raise the floor."""

    prefix: bytes  # the level's task keys: q/{queue}/{inv}/
    level: bytes  # the level key: v/{queue}/{inv}
    start: bytes  # the floor the read began at (a spot within the level)
    revision: int  # the lowest revision its ranges were read at
    keys: list[bytes]  # every task key it went through, in order, from *start* on
    floor: bytes = b""  # the floor v/ listed
    listed_at: int = 0  # the level key's mod_revision when v/ listed it (0: not listed)

    def rise(self, taken: set[str]) -> _Op | None:
        """The operation that raises the floor past the keys *taken* (claimed in the same
        transaction) that head this read, or None. Sound because the raise happens only if
        the level key is as v/ listed it, at or before this read: no task has entered since
        (every entry puts the key), so every task at or above the floor was read."""
        if not self.listed_at or self.listed_at > self.revision or self.floor < self.start:
            return None
        skip = len(self.prefix)
        for key in self.keys:
            tid = key[skip + 18 :].decode()
            if (_unenc(tid) if "%" in tid else tid) not in taken:
                top = key[skip:]  # the first task left
                break
        else:
            if not self.keys:
                return None
            top = self.keys[-1][skip:] + b"\0"  # just past the last read, every one taken
        return _raise(self.level, self.listed_at, top) if top > self.floor else None


class EtcdStore:
    """A store in an etcd v3 cluster, reached over gRPC. One instance per process."""

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        timeout: float | None = None,
        max_txn_ops: int | None = None,
        compact_after: float | None = None,
    ) -> None:
        self.url = url
        self.host, self.port, prefix = parse_etcd_url(url)
        options = etcd_url_options(url)
        given_options = (
            ("timeout", timeout),
            ("max_txn_ops", max_txn_ops),
            ("compact_after", compact_after),
        )
        for name, given in given_options:
            if given is not None and name in options and options[name] != given:
                raise ConfigError(
                    f"etcd {name} is {options[name]!r} in the URL but {given!r} as an argument"
                )
        timeout = timeout if timeout is not None else options.get("timeout", 5.0)
        max_txn_ops = (
            max_txn_ops if max_txn_ops is not None else int(options.get("max_txn_ops", 128))
        )
        self._p = prefix.encode()
        self._clock = clock
        if not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(f"etcd timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_txn_ops, bool) or not isinstance(max_txn_ops, int) or max_txn_ops < 16:
            raise ConfigError(f"max_txn_ops must be an integer >= 16, got {max_txn_ops!r}")
        compact_after = (
            compact_after
            if compact_after is not None
            else options.get("compact_after", COMPACT_AFTER)
        )
        if (
            not isinstance(compact_after, int | float)
            or not math.isfinite(compact_after)
            or compact_after < 0
        ):
            raise ConfigError(
                f"etcd compact_after must be a number of seconds >= 0 (0: never), "
                f"got {compact_after!r}"
            )
        self._timeout = float(timeout)
        self._max_ops = max_txn_ops
        self._compact_after = float(compact_after)
        self._seen_revisions: collections.deque[tuple[float, int]] = collections.deque()
        self._compacted = 0  # the revision this instance last compacted to
        self._channel: Any = None
        self._kv: Any = None
        self._lease: Any = None
        self._watch_stub: Any = None
        self._sessions: dict[str, tuple[int, bytes]] = {}  # session -> (lease id, l/ value)
        self._keepalives: dict[int, _KeepAlive] = {}
        self._records: dict[str, dict[str, Any]] = {}  # session -> its expert record, as put
        # Wake-ups: every change seen (a watch event or a write of this instance) sets the
        # current event and replaces it, so that every waiter of the moment wakes.
        self._changed = asyncio.Event()
        self._version = 0
        self._seen = 0
        self._rev = 0  # the highest etcd revision this instance has seen
        self._forgot_at = -math.inf
        self._watch_task: asyncio.Task[None] | None = None
        # stats(): task key -> ((mod, create revision, version), queue, state, updated, run_at)
        self._stat_cache: dict[bytes, tuple[tuple[int, int, int], str, str, float, float]] = {}
        self._stat_rev = 0  # the lowest revision of the last stats() read
        # task id -> (task, claim) KeyValues as this instance's claim wrote them
        self._owned: dict[str, tuple[Any, Any, _Rec]] = {}
        self._contended_until = 0.0  # monotonic time: rivals won claims of this instance
        self._windows: dict[bytes, _Window | None] = {}  # a level's tasks' prefix -> read bound
        self._swept_at = -math.inf
        self._known_levels: dict[str, dict[str, bytes]] = {}  # queue -> {level: floor}, as listed

    # -- keys --------------------------------------------------------------------------------
    def _k(self, *parts: str) -> bytes:
        return self._p + "/".join(parts).encode()

    def _task_key(self, tid: str) -> bytes:
        return self._k("t", _enc(tid))

    def _data_key(self, tid: str, what: str) -> bytes:
        return self._k("d", _enc(tid), what)

    def _claim_key(self, tid: str) -> bytes:
        return self._k("c", _enc(tid))

    def _held_key(self, expert: str, tid: str) -> bytes:
        return self._k("a", _enc(expert), _enc(tid))

    def _level(self, rec: _Rec) -> str:
        """``{queue}/{inv}``: the priority level of *rec* (under q/ its tasks, under v/ its key)."""
        return f"{_enc(rec.queue)}/{PRIORITY_BASE - rec.priority:08d}"

    @staticmethod
    def _spot(rec: _Rec) -> str:
        """``{due}/{id}``: where *rec* stands within its priority level."""
        return f"{_micros(rec.run_at):017d}/{_enc(rec.id)}"

    def _pending_key(self, rec: _Rec) -> bytes:
        return self._k("q", self._level(rec), self._spot(rec))

    # -- connection --------------------------------------------------------------------------
    async def open(self) -> None:
        if self._channel is not None:
            return
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        self._channel = rpc.insecure_channel(f"{host}:{self.port}", options=_CHANNEL_OPTIONS)
        self._kv = rpc.KVStub(self._channel)
        self._lease = rpc.LeaseStub(self._channel)
        self._watch_stub = rpc.WatchStub(self._channel)
        try:
            await self._check_schema()
        except BaseException:
            await self.close()
            raise

    async def _check_schema(self) -> None:
        meta = self._k("meta")
        for _ in range(3):
            # One snapshot: contend writes the meta key before any other key and never deletes
            # it, so keys without it belong to something else, even with contend processes
            # opening the same new prefix at once.
            resp = await self._txn(
                [],
                [
                    _get(meta),
                    _get(self._p, prefix=True, limit=1, keys_only=True),
                ],
            )
            found, some = (r.response_range.kvs for r in resp.responses)
            if found:
                self._check_meta(found[0].value)
                return
            if some:
                raise SchemaError(
                    f"etcd prefix {self._p.decode()!r} at {self.host}:{self.port} holds keys that "
                    "are not a contend store; pick another prefix (etcd://host:port/prefix)"
                )
            want = json.dumps({"schema": SCHEMA_VERSION}).encode()
            if (await self._txn([_absent(meta)], [_put(meta, want)])).succeeded:
                return
        raise StoreError(f"could not set up the contend store at {self._where()}")

    def _check_meta(self, value: bytes) -> None:
        try:
            version = json.loads(value)["schema"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SchemaError(
                f"etcd prefix {self._p.decode()!r} is not a contend store (bad meta key)"
            ) from exc
        if version != SCHEMA_VERSION:
            raise SchemaError(
                f"etcd prefix {self._p.decode()!r} has contend schema version {version}; "
                f"this contend understands version {SCHEMA_VERSION}"
            )

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
            self._watch_task = None
        for ka in list(self._keepalives.values()):
            ka.close()
        self._keepalives.clear()
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()

    async def now(self) -> float:
        return self._clock()

    # -- RPC helpers -------------------------------------------------------------------------
    def _where(self) -> str:
        return f"etcd at {self.host}:{self.port}"

    async def _call(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        if self._channel is None:
            raise StoreError("the etcd store is not open (call await store.open())")
        try:
            return await make()
        except rpc.AioRpcError as exc:
            code = exc.code()
            if code == rpc.StatusCode.UNAVAILABLE:
                raise StoreError(
                    f"cannot reach {self._where()} ({what}): {exc.details()}; is etcd running?"
                ) from exc
            if code == rpc.StatusCode.DEADLINE_EXCEEDED:
                raise StoreError(
                    f"{self._where()} did not answer {what} within {self._timeout:g}s"
                ) from exc
            raise StoreError(
                f"{self._where()} refused {what}: {code.name}: {exc.details()}"
            ) from exc

    async def _txn(
        self, compare: Sequence[_Op], success: Sequence[_Op], failure: Sequence[_Op] = ()
    ) -> Any:
        if len(success) > 2:
            success = _one_entry_per_level(success)
        req = _build(compare, success, failure)
        resp = await self._call("a transaction", lambda: self._kv.Txn(req, timeout=self._timeout))
        self._rev = max(self._rev, resp.header.revision)
        return resp

    async def _commit(
        self, compare: Sequence[_Op], success: Sequence[_Op], failure: Sequence[_Op] = ()
    ) -> Any | None:
        """A write transaction that puts a task record, safe against a lost reply: when the
        call fails, the record is read back, and if it holds exactly the value this write put
        (every record carries the writer's timestamp and history), the write landed and None
        is returned. Otherwise the error stands: the outcome is unknown."""
        try:
            return await self._txn(compare, success, failure)
        except StoreError:
            tasks = self._k("t", "")
            task_puts = [op for op in success if op[0] == PUT and op[1].startswith(tasks)]
            if not task_puts:
                raise
            try:
                kv = (await self._read_many([task_puts[0][1]]))[0]
            except StoreError:
                kv = None
            if kv is not None and kv.value == task_puts[0][2]:
                return None
            raise

    async def _range(
        self, key: bytes, end: bytes | None = None, *, limit: int = 0, keys_only: bool = False
    ) -> Any:
        req = rpc.RangeRequest(key=key, limit=limit, keys_only=keys_only)
        if end is not None:
            req.range_end = end
        resp = await self._call("a read", lambda: self._kv.Range(req, timeout=self._timeout))
        self._rev = max(self._rev, resp.header.revision)
        return resp

    async def _count(self, key: bytes, end: bytes) -> int:
        req = rpc.RangeRequest(key=key, range_end=end, count_only=True)
        resp = await self._call("a count", lambda: self._kv.Range(req, timeout=self._timeout))
        return int(resp.count)

    async def _scan(self, prefix: bytes, *, keys_only: bool = False, page: int = 1000) -> list[Any]:
        """Every key under *prefix*, in key order, read in pages."""
        out: list[Any] = []
        start, end = prefix, _prefix_end(prefix)
        while True:
            resp = await self._range(start, end, limit=page, keys_only=keys_only)
            out.extend(resp.kvs)
            if not resp.more or not resp.kvs:
                return out
            start = resp.kvs[-1].key + b"\0"

    async def _read_many(self, keys: Sequence[bytes]) -> list[Any]:
        """Read several keys in one round trip; returns the KeyValue or None for each."""
        out: list[Any] = []
        for i in range(0, len(keys), self._max_ops):
            chunk = keys[i : i + self._max_ops]
            resp = await self._txn([], [_get(k) for k in chunk])
            out.extend(
                r.response_range.kvs[0] if r.response_range.kvs else None for r in resp.responses
            )
        return out

    # -- submission and inspection ---------------------------------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        landed: set[str] = set()
        for _ in range(WRITE_RETRIES):
            out = await self._submit(specs, landed)
            if out is not None:
                if landed:
                    self._touch()
                return out
        raise StoreError(f"submission kept conflicting; gave up after {WRITE_RETRIES} tries")

    async def _submit(self, specs: Sequence[TaskSpec], landed: set[str]) -> list[Submitted] | None:
        """One try; None when a transaction lost a race (ids written so far are in *landed*)."""
        if not specs:
            return []
        now = self._clock()
        ids_read = await self._read_many([self._task_key(s.id) for s in specs])
        # The same spec sent again (a client that lost the reply): keep the task as it is.
        known = {s.id for s, kv in zip(specs, ids_read, strict=True) if kv} - landed
        keyed = list(dict.fromkeys(s.key for s in specs if s.key is not None))
        key_kvs = await self._read_many([self._k("k", _enc(k)) for k in keyed])
        existing = {
            k: kv.value.decode()
            for k, kv in zip(keyed, key_kvs, strict=True)
            if kv and kv.value.decode() not in landed
        }
        fresh: list[TaskSpec] = []
        out: list[Submitted] = []
        batch_keys: dict[str, str] = {}
        for spec in specs:
            if spec.id in known:
                out.append(Submitted(spec.id, False))
            elif spec.key is not None and spec.key in existing:
                out.append(Submitted(existing[spec.key], False))
            elif spec.key is not None and spec.key in batch_keys:
                out.append(Submitted(batch_keys[spec.key], False))
            else:
                if spec.key is not None:
                    batch_keys[spec.key] = spec.id
                if spec.id not in landed:
                    fresh.append(spec)
                out.append(Submitted(spec.id, True))
        outside = sorted({d for s in fresh for d in s.depends_on} - {s.id for s in fresh})
        dep_kvs = dict(
            zip(outside, await self._read_many([self._task_key(d) for d in outside]), strict=True)
        )
        check_batch_dependencies(fresh, lambda ids: {i for i in ids if dep_kvs.get(i) is not None})
        deps: dict[str, _Rec] = {d: _Rec.loads(kv.value) for d, kv in dep_kvs.items() if kv}
        batch_ids = {s.id for s in fresh}
        # Dead at birth: a dependency that did not succeed, or a batch member dead at birth.
        dead_cause: dict[str, str] = {}
        grew = True
        while grew:
            grew = False
            for spec in fresh:
                if spec.id in dead_cause:
                    continue
                cause = next(
                    (
                        d
                        for d in spec.depends_on
                        if (d in deps and deps[d].state in _BAD_END) or d in dead_cause
                    ),
                    None,
                )
                if cause is not None:
                    dead_cause[spec.id] = cause
                    grew = True
        # One group of operations per task; groups are packed into transactions.
        groups: list[tuple[str, list[Any], list[Any]]] = []
        touched: set[str] = set()
        awaited = {d for s in fresh if s.id not in dead_cause for d in s.depends_on}
        for spec in fresh:
            left = [
                d
                for d in spec.depends_on
                if d in batch_ids or not TaskState(deps[d].state).terminal
            ]
            failed = dead_cause.get(spec.id)
            if failed is not None:
                left = []
            rec = _Rec(
                id=spec.id,
                type=spec.type,
                queue=spec.queue,
                state=str(initial_state(spec, len(left))),
                priority=spec.priority,
                key=spec.key,
                req=spec.requirements.to_json(),
                attempts=0,
                max_attempts=spec.max_attempts,
                fence=0,
                owner=None,
                session=None,
                lease_deadline=None,
                run_at=now + spec.delay,
                created_at=now,
                updated_at=now,
                timeout=spec.timeout,
                error=None,
                depends_on=list(spec.depends_on),
                deps_left=len(left),
                has_waiters=False,
                indexed=False,
                history=[],
            )
            if failed is not None:
                rec.state = str(TaskState.DEAD)
                rec.error = _error_json("DependencyFailed", f"dependency {failed} did not succeed")
            cmp: list[Any] = []
            ops: list[Any] = []
            if spec.key is not None:
                kk = self._k("k", _enc(spec.key))
                cmp.append(_absent(kk))
                ops.append(_put(kk, spec.id))
            for d in left:
                ops.append(_put(self._k("w", _enc(d), _enc(spec.id)), b""))
                if d in deps and d not in touched:
                    # Mark the dependency as awaited, under a compare on its revision: if it
                    # ends meanwhile, this transaction fails and the submission is re-read.
                    touched.add(d)
                    deps[d].has_waiters = True
                    cmp.append(_mod_is(self._task_key(d), dep_kvs[d].mod_revision))
                    ops.append(_put(self._task_key(d), deps[d].dumps()))
            if rec.state == P:
                ops += self._enter_pending(rec)
            if spec.id in awaited and failed is None:
                rec.has_waiters = True
            cmp.append(_absent(self._task_key(spec.id)))
            payload = f"[{spec.args_json},{spec.kwargs_json}]"
            rec.checkpointed = False
            if len(payload) <= INLINE_MAX:
                rec.args = payload
            else:
                ops.append(_put(self._data_key(spec.id, "args"), payload))
            ops.append(_put(self._task_key(spec.id), rec.dumps()))
            groups.append((spec.id, cmp, ops))
        for ids, cmp, ops in self._pack(groups):
            if not (await self._txn(cmp, ops)).succeeded:
                # A concurrent submission took an idempotency key, or a dependency changed.
                # Nothing of this transaction landed; the caller starts over from a fresh read.
                return None
            landed.update(ids)
        return out

    def _pack(
        self, groups: list[tuple[str, list[Any], list[Any]]]
    ) -> Iterable[tuple[list[str], list[Any], list[Any]]]:
        """Pack per-task groups of (compares, operations) into transactions of bounded size."""
        ids: list[str] = []
        cmp: list[Any] = []
        ops: list[Any] = []
        for tid, gc, go in groups:
            if ids and (len(cmp) + len(gc) > self._max_ops or len(ops) + len(go) > self._max_ops):
                yield ids, cmp, ops
                ids, cmp, ops = [], [], []
            ids.append(tid)
            cmp, ops = cmp + gc, ops + go
        if ids:
            yield ids, cmp, ops

    @staticmethod
    def _index_value(rec: _Rec) -> bytes:
        """``{created_at} {"type", "req"}``: the creation time first, where a claim ranking
        candidates reads it without parsing JSON."""
        return f"{rec.created_at!r} {_COMPACT.encode({'type': rec.type, 'req': rec.req})}".encode()

    def _view(
        self,
        rec: _Rec,
        args: tuple[list[JSON], dict[str, JSON]] | None,
        result: JSON = None,
        checkpoint: JSON = None,
        history: bool = False,
        lease_deadline: float | None = None,
    ) -> Task:
        a, kw = args if args is not None else ([], {})
        return Task(
            id=rec.id,
            type=rec.type,
            queue=rec.queue,
            state=TaskState(rec.state),
            priority=rec.priority,
            args=a,
            kwargs=kw,
            key=rec.key,
            requirements=Requirements.from_json(rec.req),
            attempts=rec.attempts,
            max_attempts=rec.max_attempts,
            fence=rec.fence,
            owner=rec.owner,
            lease_deadline=lease_deadline if lease_deadline is not None else rec.lease_deadline,
            run_at=rec.run_at,
            created_at=rec.created_at,
            updated_at=rec.updated_at,
            timeout=rec.timeout,
            result=result,
            error=_load(rec.error),
            checkpoint=checkpoint,
            depends_on=tuple(rec.depends_on),
            history=tuple(TaskEvent(*e) for e in rec.history) if history else (),
        )

    async def _deadlines(self, recs: Iterable[_Rec]) -> dict[str, float]:
        """Reported lease deadlines of owned tasks: their session's (last heartbeat + TTL, or
        when it was deregistered). etcd's TTL is the truth; this is its approximation."""
        owned = [r for r in recs if r.owner is not None and r.state in _OWNED_S]
        names = sorted({r.owner for r in owned if r.owner is not None})
        kvs = await self._read_many([self._k("e", _enc(n)) for n in names])
        sessions: dict[tuple[str, str], float] = {}
        for n, kv in zip(names, kvs, strict=True):
            if kv is not None:
                d = json.loads(kv.value)
                sessions[(n, d["session"])] = _session_deadline(d)
                for old, deadline in d.get("ended", {}).items():
                    sessions[(n, old)] = deadline
        out = {}
        for r in owned:
            assert r.owner is not None
            found = sessions.get((r.owner, r.session or ""))
            out[r.id] = found if found is not None else (r.lease_deadline or r.updated_at)
        return out

    async def _payloads(
        self, recs: Sequence[_Rec], *, result: bool = True
    ) -> list[tuple[tuple[list[JSON], dict[str, JSON]] | None, JSON, JSON]]:
        """(args, result, checkpoint) of each record: from the record where it is kept there,
        else from its d/ key, all such keys read in one round trip."""
        keys: list[bytes] = []
        for rec in recs:
            if rec.args is None:
                keys.append(self._data_key(rec.id, "args"))
            if result and rec.state == "succeeded" and rec.result is None:
                keys.append(self._data_key(rec.id, "result"))
            if rec.checkpointed is not False:
                keys.append(self._data_key(rec.id, "checkpoint"))
        kvs = await self._read_many(keys)
        found = {k: kv.value for k, kv in zip(keys, kvs, strict=True) if kv is not None}
        out: list[tuple[tuple[list[JSON], dict[str, JSON]] | None, JSON, JSON]] = []
        for rec in recs:
            a = rec.args if rec.args is not None else found.get(self._data_key(rec.id, "args"))
            r = None
            if result and rec.state == "succeeded":
                r = (
                    rec.result
                    if rec.result is not None
                    else found.get(self._data_key(rec.id, "result"))
                )
            c = found.get(self._data_key(rec.id, "checkpoint"))
            args = json.loads(a) if a is not None else None
            out.append(
                (
                    (args[0], args[1]) if args else None,
                    json.loads(r) if r is not None else None,
                    json.loads(c) if c is not None else None,
                )
            )
        return out

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        t = (await self._read_many([self._task_key(task_id)]))[0]
        if t is None:
            raise TaskNotFound(task_id)
        rec = _Rec.loads(t.value)
        deadline = (await self._deadlines([rec])).get(rec.id)
        ((args, result, checkpoint),) = await self._payloads([rec])
        return self._view(rec, args, result, checkpoint, history, deadline)

    async def list_tasks(
        self, *, state: TaskState | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Task]:
        check_limit(limit)
        if not limit:
            return []
        want = None if state is None else str(TaskState(state))
        recs: list[_Rec] = []
        for kv in await self._scan(self._k("t", "")):
            rec = _Rec.loads(kv.value)
            if (want is None or rec.state == want) and (queue is None or rec.queue == queue):
                recs.append(rec)
        recs.sort(key=lambda r: r.id)
        recs = recs[:limit]
        data = await self._payloads(recs)
        deadlines = await self._deadlines(recs)
        return [
            self._view(rec, args, result, checkpoint, False, deadlines.get(rec.id))
            for rec, (args, result, checkpoint) in zip(recs, data, strict=True)
        ]

    async def stats(self) -> StoreStats:
        now = self._clock()
        counts: dict[str, dict[str, int]] = {}
        done = 0
        oldest: float | None = None
        for _, queue, state, updated_at, run_at in await self._stat_rows():
            q = counts.setdefault(queue, {})
            q[state] = q.get(state, 0) + 1
            if state == "succeeded" and updated_at > now - 60:
                done += 1
            elif state == "pending" and run_at <= now:
                age = now - run_at
                oldest = age if oldest is None else max(oldest, age)
        return StoreStats(now, counts, await self.list_experts(), done, oldest)

    async def _stat_rows(self) -> list[tuple[tuple[int, int, int], str, str, float, float]]:
        """(revisions, queue, state, updated_at, run_at) of every task, for stats(). Polled
        often (progress displays, the benchmark) while few tasks change between two calls:
        the keys are read without values, and only the records whose revisions moved since
        the last call are read again; many moved records are read in one scan instead."""
        prefix = self._k("t", "")
        keys: list[Any] = []
        start, end, low = prefix, _prefix_end(prefix), None
        while True:
            resp = await self._range(start, end, limit=5000, keys_only=True)
            low = resp.header.revision if low is None else min(low, resp.header.revision)
            keys.extend(resp.kvs)
            if not resp.more or not resp.kvs:
                break
            start = resp.kvs[-1].key + b"\0"
        cache = self._stat_cache
        if low is not None and low < self._stat_rev:  # another cluster behind the same URL
            cache.clear()
        self._stat_rev = max(self._stat_rev, low or 0)

        def row(kv: Any) -> tuple[tuple[int, int, int], str, str, float, float]:
            rec = _Rec.loads(kv.value)
            revs = (kv.mod_revision, kv.create_revision, kv.version)
            return revs, rec.queue, rec.state, rec.updated_at, rec.run_at

        def revs(kv: Any) -> tuple[int, int, int]:
            return kv.mod_revision, kv.create_revision, kv.version

        stale = [kv.key for kv in keys if (r := cache.get(kv.key)) is None or r[0] != revs(kv)]
        fresh: dict[bytes, tuple[tuple[int, int, int], str, str, float, float]] = {}
        if len(stale) > max(256, len(keys) // 4):
            for kv in await self._scan(prefix):
                fresh[kv.key] = row(kv)
        else:
            gone = set()
            for key, kv in zip(stale, await self._read_many(stale), strict=True):
                if kv is None:
                    gone.add(key)
                else:
                    fresh[key] = row(kv)
            for kv in keys:
                if kv.key not in fresh and kv.key not in gone:
                    fresh[kv.key] = cache[kv.key]
        self._stat_cache = fresh
        return list(fresh.values())

    async def list_experts(self) -> list[ExpertRecord]:
        resp = await self._txn(
            [], [_get(self._k("e", ""), prefix=True), _get(self._k("l", ""), prefix=True)]
        )
        experts, sessions = (r.response_range.kvs for r in resp.responses)
        live = {json.loads(kv.value)["session"] for kv in sessions}
        out = []
        for kv in experts:
            d = json.loads(kv.value)
            alive = d["session"] in live
            deadline = _session_deadline(d)
            out.append(
                ExpertRecord(
                    info=ExpertInfo.from_json_text(d["info"]),
                    session=d["session"],
                    alive=alive,
                    load=d["load"],
                    lease_deadline=deadline,
                    heartbeat_at=d["heartbeat_at"],
                    started_at=d["started_at"],
                    claim_attempts=d["claim_attempts"],
                    claims_won=d["claims_won"],
                    tasks_done=d["tasks_done"],
                    metrics=d.get("metrics") or {},
                )
            )
        return sorted(out, key=lambda e: e.info.id)

    # -- the claim protocol ----------------------------------------------------------------
    @staticmethod
    def _rank_of(rec: _Rec, now: float) -> _RankT:
        """A pending task's place in claim order, smallest first: the highest effective
        priority (the priority aged since the task was created, in whole steps), then the
        earliest due time, then the id. _candidates makes the same from index keys."""
        due = f"{_micros(rec.run_at):017d}"
        return -aged_priority(rec.priority, now - rec.created_at), due, rec.id

    async def _read_index(
        self,
        prefix: bytes,
        start: bytes,
        page: int,
        want: int,
        keep: Callable[[Any], bool],
        window_of: bytes = b"",
    ) -> tuple[list[Any], _LevelRead]:
        """The KeyValues of a priority level's tasks (keys under *prefix*, from *start*) that
        *keep* accepts, in key order: at least *want* where there are that many, from at least
        a *page* of keys; and what the read went through.

        etcd counts every key of a range it reads, whatever the limit, so a read to the end of
        a level costs time in proportion to its backlog (about 50 ms at 100,000 tasks). Each
        level's read therefore stops at a bound a little past the further of *start* and
        where the last read ended (its ``_Window``); only when fewer keys lie before the bound
        does it read on to the end.
        *window_of* keeps the windows of reads of different sizes apart."""
        end = _prefix_end(prefix)
        wkey = prefix + window_of
        window = self._windows.get(wkey)
        segments = [(start, end)] if window is None else window.segments(prefix, start, end)
        out: list[Any] = []
        keys: list[bytes] = []
        revision = 0
        first_count = 0  # keys in the first range
        spilled = False
        # A whole page in key order, as an unbounded read would give, and *want* accepted.
        for n, (lo, hi) in enumerate(segments):
            spilled = n > 0
            while len(out) < want or len(keys) < page:
                resp = await self._range(lo, hi, limit=page)
                revision = revision or resp.header.revision
                first_count = first_count or int(resp.count)
                for kv in resp.kvs:
                    keys.append(kv.key)
                    if keep(kv):
                        out.append(kv)
                if not resp.more or not resp.kvs:
                    break
                lo = resp.kvs[-1].key + b"\0"
            if len(out) >= want and len(keys) >= page:
                break
        full = len(out) >= want and len(keys) >= page
        if len(self._windows) >= WINDOW_CACHE and wkey not in self._windows:
            self._windows.clear()  # levels come and go: forget them all now and then
        last = keys[-1] if keys else b""
        self._windows[wkey] = _Window.after(
            window, len(prefix), start, last, spilled, first_count, page, full
        )
        level = self._p + b"v/" + prefix[len(self._p) + 2 : -1]
        return out, _LevelRead(prefix, level, start[len(prefix) :], revision, keys)

    async def _levels(self, queue: str) -> list[tuple[str, bytes, int]]:
        """(``{inv}``, floor, the key's mod_revision) of each priority level of *queue* that may
        hold pending tasks, best first. No pending task of a level stands below its floor."""
        prefix = self._k("v", _enc(queue), "")
        resp = await self._range(prefix, _prefix_end(prefix))
        return [(kv.key[len(prefix) :].decode(), kv.value, kv.mod_revision) for kv in resp.kvs]

    async def _candidates(
        self,
        queues: Sequence[str],
        caps: Capabilities,
        limit: int,
        now: float,
        want: int = 0,
        views: dict[str, TaskView | tuple[str, int, bytes]] | None = None,
        reads: dict[str, _LevelRead] | None = None,
    ) -> list[tuple[str, _RankT]]:
        """(task id, rank) of due tasks *caps* can run, best first: at least *limit* (or
        *want*) of each priority level of each queue where there are that many. *views*, if
        given, receives what the index holds of each: (queue, priority, index value); *reads*
        the read of its level."""
        want = max(want, limit)
        # A claim reads twice what it wants, to have others to try when rivals win some; a
        # peek (which fills *views*) only what it returns.
        page = max(64, limit if views is not None else 2 * limit, want)
        now_us = _micros(now)

        def keep(kv: Any) -> bool:
            due = int(kv.key.rsplit(b"/", 2)[1])  # the due time is in the key
            return due <= now_us and (
                _REQ_NONE in kv.value
                or caps.satisfies(Requirements.from_json(_index_json(kv.value)["req"]))
            )

        async def level(queue: str, inv: str, floor: bytes) -> tuple[_LevelRead, list[Any]]:
            prefix = self._k("q", _enc(queue), inv, "")
            priority = PRIORITY_BASE - int(inv)
            aged: dict[bytes, int] = {}  # tasks submitted together share their creation time
            out = []
            kvs, read = await self._read_index(prefix, prefix + floor, page, want, keep)
            for kv in kvs:
                due, tid = kv.key[len(prefix) :].decode().split("/")
                tid = _unenc(tid) if "%" in tid else tid
                created = kv.value[: kv.value.index(b" ")]
                step = aged.get(created)
                if step is None:
                    step = aged[created] = aged_priority(priority, now - float(created))
                out.append((tid, (-step, due, tid)))  # as _rank_of
                if views is not None:
                    views[tid] = (queue, priority, kv.value)
            return read, out

        async def queue_levels(queue: str) -> list[tuple[str, _RankT]]:
            """Read every level v/ lists, from its floor. The levels seen last time are read
            from the floors seen then, meanwhile; a level whose floor came down since (a task
            entered below it) is read again."""
            known = self._known_levels.get(queue, {})

            async def levels(floors: Iterable[tuple[str, bytes]]) -> dict[str, Any]:
                got = await asyncio.gather(*(level(queue, inv, f) for inv, f in floors))
                return dict(zip((inv for inv, _ in floors), got, strict=True))

            listed, done = await asyncio.gather(self._levels(queue), levels(list(known.items())))
            again = [(inv, f) for inv, f, _ in listed if inv not in known or f < known[inv]]
            done.update(await levels(again))
            self._known_levels[queue] = {inv: f for inv, f, _ in listed}
            for inv, f, mod in listed:
                done[inv][0].floor, done[inv][0].listed_at = f, mod
            found = []
            for read, out in done.values():
                found += out
                if reads is not None:
                    for tid, _ in out:
                        reads[tid] = read
            return found

        found = [
            f
            for r in await asyncio.gather(*(queue_levels(q) for q in dict.fromkeys(queues)))
            for f in r
        ]
        found.sort(key=lambda f: f[1])
        return found

    async def _choose(
        self,
        queues: Sequence[str],
        caps: Capabilities,
        limit: int,
        low_lane: int,
        now: float,
        spread: bool = False,
        views: dict[str, TaskView | tuple[str, int, bytes]] | None = None,
        reads: dict[str, _LevelRead] | None = None,
    ) -> list[str]:
        """Ids of the tasks to try, in claim order: the best ``limit − low_lane`` by effective
        priority, plus the ``low_lane`` due the longest; more of the best after them, to try
        when rivals win some. With *spread* (rivals have been winning this instance's races),
        the best are taken from a random place among the equally good candidates read, so that
        experts reading the same head of the index do not all reach for the same tasks.
        *views* receives what the priority index holds of the candidates it read, *reads*
        the read of each one's level."""
        low_lane = max(0, min(low_lane, limit))
        want = min(SPREAD_DEPTH * limit, 1024) if spread else 0
        best = await self._candidates(queues, caps, limit, now, want, views, reads)
        # Each level's head is its longest waiting: those due first among all levels read.
        oldest = sorted(best, key=lambda f: f[1][1:])[:low_lane] if low_lane else []
        if spread and best:
            top = best[0][1][0]
            level = next((n for n, f in enumerate(best) if f[1][0] != top), len(best))
            if level > limit:  # more equally good tasks than wanted: take a stripe of them
                shift = limit * random.randrange(level // limit)
                best = best[shift:level] + best[:shift] + best[level:]
        chosen = dict.fromkeys(f[0] for f in best[: limit - low_lane])
        for tid, _ in oldest:
            chosen.setdefault(tid)
        order = dict(best)
        first = sorted(chosen, key=lambda t: order[t])
        return first + [f[0] for f in best if f[0] not in chosen]

    async def peek(
        self,
        queues: Sequence[str],
        capabilities: Capabilities,
        limit: int,
        *,
        low_lane: int = 0,
    ) -> list[TaskView]:
        check_limit(limit)
        if not queues or not limit:
            return []
        views: dict[str, TaskView | tuple[str, int, bytes]] = {}  # no task record to read
        now = self._clock()
        ids = await self._choose(queues, capabilities, limit, low_lane, now, views=views)
        out = []
        for tid in ids[:limit]:
            v = views[tid]
            if not isinstance(v, TaskView):  # what the priority index holds
                queue, priority, value = v
                d = _index_json(value)
                created = float(value[: value.index(b" ")])
                v = TaskView(
                    tid, d["type"], queue, priority, Requirements.from_json(d["req"]), created
                )
            out.append(v)
        return out

    @staticmethod
    def _task_view(rec: _Rec) -> TaskView:
        req = Requirements.from_json(rec.req)
        return TaskView(rec.id, rec.type, rec.queue, rec.priority, req, rec.created_at)

    async def _session(self, expert: str, session: str) -> tuple[int, bytes]:
        """(lease id, session key value) of a live session; raises LeaseLost."""
        kv = (await self._read_many([self._k("l", _enc(expert))]))[0]
        if kv is None or json.loads(kv.value)["session"] != session:
            self._sessions.pop(session, None)
            raise LeaseLost(f"expert {expert}: session {session} is not live")
        lease = int(json.loads(kv.value)["lease"])
        self._remember(session, lease, kv.value)
        return lease, kv.value

    def _remember(self, session: str, lease: int, value: bytes) -> None:
        """Cache a live session's lease (etcd has the truth); keep the newest sessions only."""
        self._sessions[session] = (lease, value)
        while len(self._sessions) > SESSION_CACHE:
            oldest = next(iter(self._sessions))
            self._drop_session(oldest, self._sessions[oldest][0])

    async def claim(
        self,
        expert: str,
        session: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
        task_ids: Sequence[str] | None = None,
        start: bool = True,
        low_lane: int = 0,
    ) -> list[Claimed]:
        check_limit(limit)
        check_ttl(lease_ttl)
        if not queues or not limit or (task_ids is not None and not task_ids):
            await self._session(expert, session)
            return []
        now = self._clock()
        cands: list[str]  # task ids, best first
        reads: dict[str, _LevelRead] = {}  # task id -> the read of its level
        # The session check and the first read overlap: one round trip less per claim.
        if task_ids is None:
            (lease, session_value), cands = await asyncio.gather(
                self._session(expert, session),
                self._choose(
                    queues,
                    capabilities,
                    limit,
                    low_lane,
                    now,
                    spread=time.monotonic() < self._contended_until,
                    reads=reads,
                ),
            )
        else:
            ids = list(dict.fromkeys(task_ids))
            qs = set(queues)
            (lease, session_value), kvs = await asyncio.gather(
                self._session(expert, session),
                self._read_many([self._task_key(t) for t in ids]),
            )
            named: list[tuple[_RankT, str]] = []
            for tid, kv in zip(ids, kvs, strict=True):
                if kv is None:
                    continue
                rec = _Rec.loads(kv.value)
                if (
                    rec.state == "pending"
                    and rec.indexed
                    and rec.run_at <= now
                    and rec.queue in qs
                    and capabilities.satisfies(Requirements.from_json(rec.req))
                ):
                    named.append((self._rank_of(rec, now), tid))
            cands = [tid for _, tid in sorted(named)]  # the best of the named tasks first
        ttl = json.loads(session_value).get("ttl", lease_ttl)
        won: list[tuple[_RankT, Claimed]] = []
        session_key = self._k("l", _enc(expert))
        levels_base = len(self._k("v", ""))
        lost = False
        orders: dict[str, _RankT] = {}  # task id -> its claim order

        parsed: dict[str, _Rec] = {}  # records parsed by the round's check, used once
        claim_head = json.dumps({"expert": expert, "session": session})[:-1]  # c/ value, open

        def prepare(tid: str, t: Any) -> tuple[list[Any], list[Any], _Rec]:
            """(compares, operations, new record) that claim one task read as *t*."""
            rec = parsed.pop(tid, None) or _Rec.loads(t.value)
            assert rec.indexed
            orders[tid] = self._rank_of(rec, now)
            ops = self._leave_pending(rec)
            rec.state = str(R if start else C)
            rec.owner = expert
            rec.session = session
            rec.fence += 1
            rec.attempts += 1
            rec.lease_deadline = now + ttl
            rec.updated_at = now
            rec.event(now, "claimed", expert)
            claim = f'{claim_head},"fence":{rec.fence}}}'
            return (
                [_mod_is(t.key, t.mod_revision)],  # pending as read: so no claim key either
                [
                    _put(t.key, rec.dumps()),
                    _put(self._claim_key(tid), claim, lease),
                    _put(self._held_key(expert, tid), f"{rec.fence} {session}"),
                    *ops,
                ],
                rec,
            )

        def finish(tid: str, t: Any, a: Any, c: Any, rec: _Rec, ops: list[Any], rev: int) -> None:
            """Record a claim that landed at revision *rev* (0: unknown, a lost reply)."""
            if rev:
                self._remember_owned(tid, ops[0], ops[1], rev, rec)
            args, kwargs = a
            claimed = Claimed(
                id=tid,
                type=rec.type,
                queue=rec.queue,
                args=args,
                kwargs=kwargs,
                fence=rec.fence,
                attempt=rec.attempts,
                max_attempts=rec.max_attempts,
                checkpoint=c,
                timeout=rec.timeout,
                lease_deadline=now + ttl,
                priority=rec.priority,
            )
            won.append((orders[tid], claimed))

        def rises(tids: Sequence[str]) -> list[_Op]:
            """Raise the floor of each level these tasks head (claimed in one transaction):
            the next claims read from where the live tasks begin, not through the deleted
            keys etcd keeps until its history is compacted. The next claim of this instance
            reads from the raised floor (if the raise did not land, v/ lists a lower floor
            and the level is read again from there)."""
            taken = set(tids)
            levels = {id(r): r for t in tids if (r := reads.get(t)) is not None}
            return [op for r in levels.values() if (op := r.rise(taken)) is not None][:RISE_OPS]

        def risen(ops: Sequence[_Op]) -> None:
            """Remember the floors a landed claim raised (if a raise did not land, v/ lists
            a lower floor next time, and the level is read again from there)."""
            for op in ops:
                if op[0] == RAISE:
                    queue, inv = op[1][levels_base:].decode().split("/")
                    self._known_levels.setdefault(_unenc(queue), {})[inv] = op[3]

        def session_lost(resp: Any) -> bool:
            kvs = resp.responses[0].response_range.kvs
            return not kvs or kvs[0].value != session_value

        async def one(tid: str, t: Any, a: Any, c: Any) -> None:
            """One claim transaction for one task (the fallback when a batch lost a race)."""
            nonlocal lost
            cmp, ops, rec = prepare(tid, t)
            up = rises([tid])
            resp = await self._commit(
                [*cmp, _value_is(session_key, session_value)], [*ops, *up], [_get(session_key)]
            )
            if resp is not None and not resp.succeeded:
                if session_lost(resp):
                    lost = True
                else:
                    self._contended_until = time.monotonic() + CONTENDED_FOR
                return  # another expert won this one, or the session ended
            risen(up)
            finish(tid, t, a, c, rec, ops, resp.header.revision if resp is not None else 0)

        async def many(group: list[tuple[str, Any, Any, Any]]) -> None:
            """Claim a group of tasks in one transaction: every task's revision and absent
            claim key, and the live session, are compared at once. When any task moved
            meanwhile (a rival claimed it), one read tells which: the tasks still as read are
            tried again together, the others are left to the rival."""
            nonlocal lost
            while group:
                if len(group) == 1:
                    await one(*group[0])
                    return
                plans = [prepare(tid, t) for tid, t, _, _ in group]
                up = rises([g[0] for g in group])
                resp = await self._commit(
                    [*(x for p in plans for x in p[0]), _value_is(session_key, session_value)],
                    [*(x for p in plans for x in p[1]), *up],
                    [_get(session_key)],
                )
                if resp is None or resp.succeeded:
                    risen(up)
                    rev = resp.header.revision if resp is not None else 0
                    for (tid, t, a, c), (_, ops, rec) in zip(group, plans, strict=True):
                        finish(tid, t, a, c, rec, ops, rev)
                    return
                if session_lost(resp):
                    lost = True
                    return
                # Which tasks moved: one read (a lost race is rare once claims spread out).
                now_kvs = await self._read_many(
                    [k for tid, t, _, _ in group for k in (t.key, self._claim_key(tid))]
                )
                still = [
                    g
                    for n, g in enumerate(group)
                    if now_kvs[2 * n] is not None
                    and now_kvs[2 * n].mod_revision == g[1].mod_revision
                    and now_kvs[2 * n + 1] is None
                ]
                self._contended_until = time.monotonic() + CONTENDED_FOR
                if len(still) == len(group):  # cannot tell what moved: one at a time
                    await asyncio.gather(*(one(*g) for g in group))
                    return
                group = still

        # Rounds: try as many candidates as claims are still wanted, in order, until enough
        # were won or the candidates ran out. The tries of a round are grouped into as few
        # transactions as etcd's operation limit allows, committed concurrently.
        per_txn = max(1, (self._max_ops - 1 - RISE_OPS) // CLAIM_OPS)
        rest = cands
        while rest and len(won) < limit and not lost:
            batch, rest = rest[: limit - len(won)], rest[limit - len(won) :]
            records = await self._read_many([self._task_key(tid) for tid in batch])
            ready: list[tuple[str, Any, _Rec]] = []
            for tid, t in zip(batch, records, strict=True):
                if t is None:
                    continue
                rec = _Rec.loads(t.value)
                if rec.state == "pending" and rec.indexed and rec.run_at <= now:
                    ready.append((tid, t, rec))
            tries: list[tuple[str, Any, Any, Any]] = []
            payloads = await self._payloads([rec for _, _, rec in ready], result=False)
            for (tid, t, rec), (a, _, c) in zip(ready, payloads, strict=True):
                if a is None:  # not written yet: the submission is still going on
                    continue
                tries.append((tid, t, a, c))
                parsed[tid] = rec
            await asyncio.gather(
                *(many(tries[i : i + per_txn]) for i in range(0, len(tries), per_txn))
            )
        if lost:
            # Claims won in the same round vanished with the lease; expire() returns them.
            self._sessions.pop(session, None)
            raise LeaseLost(f"expert {expert}: session {session} is not live")
        won.sort(key=lambda w: w[0])
        return [c for _, c in won]

    async def steal(
        self,
        thief: str,
        session: str,
        victim: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
    ) -> list[Claimed]:
        check_limit(limit)
        check_ttl(lease_ttl)
        lease, session_value = await self._session(thief, session)
        if not queues or not limit:
            return []
        ttl = json.loads(session_value).get("ttl", lease_ttl)
        # The victim's live claims: the claim keys on its session's lease.
        live = (await self._read_many([self._k("l", _enc(victim))]))[0]
        if live is None:
            return []
        cbase = self._k("c", "")
        held = [
            _unenc(k[len(cbase) :].decode())
            for k in await self._lease_claims(int(json.loads(live.value)["lease"]))
        ]
        reads = await self._read_many(
            [k for t in held for k in (self._task_key(t), self._claim_key(t))]
        )
        qs = set(queues)
        loot: list[tuple[tuple[int, float, str], Any, Any]] = []
        for n, tid in enumerate(held):
            t, c = reads[2 * n : 2 * n + 2]
            if t is None or c is None:
                continue
            rec = _Rec.loads(t.value)
            if (
                rec.owner == victim
                and rec.state == "claimed"
                and rec.queue in qs
                and capabilities.satisfies(Requirements.from_json(rec.req))
            ):
                loot.append(((-rec.priority, rec.run_at, tid), t, c))
        loot.sort(key=lambda item: item[0])
        session_key = self._k("l", _enc(thief))
        now = self._clock()
        lost = False

        async def one(t: Any, c: Any) -> Claimed | None:
            nonlocal lost
            rec = _Rec.loads(t.value)
            tid = rec.id
            rec.state, rec.owner, rec.session = "running", thief, session
            rec.fence += 1
            rec.lease_deadline, rec.updated_at = now + ttl, now
            rec.event(now, "stolen", thief, f"from {victim}")
            claim = json.dumps({"expert": thief, "session": session, "fence": rec.fence})
            resp = await self._commit(
                [
                    _mod_is(t.key, t.mod_revision),
                    _mod_is(c.key, c.mod_revision),
                    _value_is(session_key, session_value),
                ],
                [
                    _put(t.key, rec.dumps()),
                    _put(c.key, claim, lease),
                    _delete(self._held_key(victim, tid)),
                    _put(self._held_key(thief, tid), f"{rec.fence} {session}"),
                ],
                [_get(session_key)],
            )
            if resp is not None and not resp.succeeded:
                kvs = resp.responses[0].response_range.kvs
                lost = lost or not kvs or kvs[0].value != session_value
                return None  # the victim started it, or someone else stole it first
            ((a, _, ck),) = await self._payloads([rec], result=False)
            args, kwargs = a if a is not None else ([], {})
            return Claimed(
                id=tid,
                type=rec.type,
                queue=rec.queue,
                args=args,
                kwargs=kwargs,
                fence=rec.fence,
                attempt=rec.attempts,
                max_attempts=rec.max_attempts,
                checkpoint=ck,
                timeout=rec.timeout,
                lease_deadline=now + ttl,
                priority=rec.priority,
            )

        got = await asyncio.gather(*(one(t, c) for _, t, c in loot[:limit]))
        if lost:
            self._sessions.pop(session, None)
            raise LeaseLost(f"expert {thief}: session {session} is not live")
        return [c for c in got if c is not None]

    async def _owner_write(
        self,
        expert: str,
        task_id: str,
        fence: int,
        states: frozenset[str],
        apply: Callable[[_Rec, float], list[Any]],
        first: tuple[Any, Any] | None = None,
    ) -> FencedOut | None:
        """Check owner, fence, state and live claim, then commit *apply*'s operations in one
        Txn that compares the task and claim revisions read; re-read when either moved.
        *first* is the (task, claim) pair already read for the first try, if any."""
        tkey, ckey = self._task_key(task_id), self._claim_key(task_id)
        for _ in range(WRITE_RETRIES):
            if first is not None:
                (t, c), first = first, None
            else:
                t, c = await self._read_many([tkey, ckey])
            checked = self._check_owner(expert, task_id, fence, states, t, c)
            if isinstance(checked, FencedOut):
                return checked
            rec = checked
            now = self._clock()
            ops = apply(rec, now)
            resp = await self._commit(
                [_mod_is(tkey, t.mod_revision), _mod_is(ckey, c.mod_revision)], ops
            )
            if resp is None or resp.succeeded:
                return None
        raise StoreError(f"task {task_id} kept changing; gave up after {WRITE_RETRIES} tries")

    def _remember_owned(self, tid: str, task_put: _Op, claim_put: _Op, rev: int, rec: _Rec) -> None:
        """Keep the task and claim keys as a claim of this instance put them at *rev*, and
        the record it wrote (not to be changed after)."""
        self._owned[tid] = (
            _KV(task_put[1], task_put[2], rev),
            _KV(claim_put[1], claim_put[2], rev),
            rec,
        )
        while len(self._owned) > OWNED_CACHE:  # tasks lost to expiry are never written again
            del self._owned[next(iter(self._owned))]

    @staticmethod
    def _check_owner(
        expert: str, task_id: str, fence: int, states: frozenset[str], t: Any, c: Any
    ) -> _Rec | FencedOut:
        """The task record when *expert* may write it at *fence*, else why not."""
        if t is None:
            return FencedOut(task_id, fence, "no such task")
        rec = _Rec.loads(t.value)
        refused = EtcdStore._refusal(expert, fence, states, rec)
        if refused is not None:
            return FencedOut(task_id, fence, refused)
        if c is None or json.loads(c.value)["fence"] != fence:
            return FencedOut(task_id, fence, "the lease lapsed")
        return rec

    @staticmethod
    def _refusal(expert: str, fence: int, states: frozenset[str], rec: _Rec) -> str | None:
        """Why the record *rec* does not let *expert* write at *fence*, or None."""
        if rec.fence != fence:
            return f"the task is at fence {rec.fence}"
        if rec.owner != expert:
            return f"{expert} does not own it (owner: {rec.owner})"
        if rec.state not in states:
            return f"the task is {rec.state}"
        return None

    async def _owner_writes(
        self,
        expert: str,
        items: Sequence[tuple[str, int]],
        states: frozenset[str],
        apply: Callable[[int], Callable[[_Rec, float], list[Any]]],
    ) -> list[FencedOut | None]:
        """Owner writes of a batch: one read for all, then the writes that pass the checks
        grouped into as few transactions as etcd's operation limit allows (each compares
        every task's and claim's revision), committed concurrently. When a group's
        transaction fails because one of its tasks moved, each of its tasks is written on
        its own (re-read and re-checked). *apply(n)* gives the operations of the n-th item."""
        # What this instance's own claim wrote stands in for a read: the transaction compares
        # both revisions, so a task that changed since makes it fail and be re-read below.
        known: list[tuple[Any, Any] | None] = []
        checks: dict[int, _Rec] = {}
        for n, (tid, fence) in enumerate(items):
            mine = self._owned.pop(tid, None)
            if mine is not None and self._refusal(expert, fence, states, mine[2]) is None:
                known.append((mine[0], mine[1]))  # the claim key holds the same fence
                checks[n] = mine[2]
            else:
                known.append(None)  # decide refusals on what etcd holds now
        unknown = [n for n, k in enumerate(known) if k is None]
        reads = await self._read_many(
            [
                k
                for n in unknown
                for k in (self._task_key(items[n][0]), self._claim_key(items[n][0]))
            ]
        )
        for i, n in enumerate(unknown):
            known[n] = (reads[2 * i], reads[2 * i + 1])
        out: list[FencedOut | None] = [None] * len(items)
        groups: list[list[tuple[int, list[Any], list[Any]]]] = [[]]
        n_cmp = n_ops = 0
        in_group: set[str] = set()
        now = self._clock()
        for n, (tid, fence) in enumerate(items):
            t, c = known[n] or (None, None)
            checked = checks.pop(n, None) or self._check_owner(expert, tid, fence, states, t, c)
            if isinstance(checked, FencedOut):
                out[n] = checked
                continue
            assert t is not None and c is not None  # the checks passed
            ops = apply(n)(checked, now)
            cmp = [_mod_is(t.key, t.mod_revision), _mod_is(c.key, c.mod_revision)]
            # A key may appear once per transaction: a repeated task starts a new group.
            if groups[-1] and (
                tid in in_group
                or n_cmp + len(cmp) > self._max_ops
                or n_ops + len(ops) > self._max_ops
            ):
                groups.append([])
                n_cmp = n_ops = 0
                in_group = set()
            groups[-1].append((n, cmp, ops))
            in_group.add(tid)
            n_cmp += len(cmp)
            n_ops += len(ops)

        async def write(group: list[tuple[int, list[Any], list[Any]]]) -> None:
            if len(group) > 1:
                resp = await self._commit(
                    [x for _, cmp, _ in group for x in cmp],
                    [x for _, _, ops in group for x in ops],
                )
                if resp is None or resp.succeeded:
                    return
            elif group:
                n, cmp, ops = group[0]
                resp = await self._commit(cmp, ops)
                if resp is None or resp.succeeded:
                    return
            results = await asyncio.gather(
                *(
                    self._owner_write(expert, items[n][0], items[n][1], states, apply(n))
                    for n, _, _ in group
                )
            )
            for (n, _, _), res in zip(group, results, strict=True):
                out[n] = res

        await asyncio.gather(*(write(g) for g in groups))
        return out

    def _unown(self, rec: _Rec, expert: str) -> list[Any]:
        """Operations that end *expert*'s ownership of *rec* (its record is put separately)."""
        rec.owner, rec.session, rec.lease_deadline = None, None, None
        return [_delete(self._claim_key(rec.id)), _delete(self._held_key(expert, rec.id))]

    def _enter_pending(self, rec: _Rec) -> list[Any]:
        """Make *rec* pending: its key in the priority index, its level's floor at most it."""
        rec.state = "pending"
        rec.indexed = True
        level, spot = self._level(rec), self._spot(rec)
        return [
            _put(self._k("q", level, spot), self._index_value(rec)),
            _enter(self._k("v", level), spot.encode()),
        ]

    def _leave_pending(self, rec: _Rec) -> list[Any]:
        """Take a pending *rec* out of the index (its new state is set by the caller)."""
        if not rec.indexed:
            return []
        rec.indexed = False
        return [_delete(self._pending_key(rec))]

    def _ended(self, rec: _Rec) -> list[Any]:
        """Operations for a task that just reached a terminal state."""
        return [_put(self._k("s", _enc(rec.id)), rec.state)] if rec.has_waiters else []

    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        def apply(rec: _Rec, now: float) -> list[Any]:
            rec.state, rec.updated_at = "running", now
            rec.event(now, "started", expert)
            return [_put(self._task_key(rec.id), rec.dumps())]

        return await self._owner_writes(expert, items, frozenset({"claimed"}), lambda n: apply)

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        check_ttl(lease_ttl)
        lease, session_value = self._sessions.get(session) or await self._session(expert, session)
        ka = self._keepalives.get(lease)
        if ka is None:
            ka = self._keepalives[lease] = _KeepAlive(self, lease)
        remaining = await ka.refresh()
        if remaining <= 0:
            self._drop_session(session, lease)
            raise LeaseLost(f"expert {expert}: the etcd lease of session {session} expired")
        now = self._clock()
        ekey, lkey = self._k("e", _enc(expert)), self._k("l", _enc(expert))
        d = self._records.get(session)
        if d is None:
            e = (await self._read_many([ekey]))[0]
            if e is None:
                self._drop_session(session, lease)
                raise LeaseLost(f"expert {expert}: its record is gone")
            d = json.loads(e.value)
        d.update(
            heartbeat_at=now,
            load=beat.load,
            claim_attempts=beat.claim_attempts,
            claims_won=beat.claims_won,
            tasks_done=beat.tasks_done,
            metrics=dict(beat.metrics),
        )
        resp = await self._txn([_value_is(lkey, session_value)], [_put(ekey, json.dumps(d))])
        if not resp.succeeded:
            self._drop_session(session, lease)
            raise LeaseLost(f"expert {expert}: session {session} is not live")
        self._records[session] = d
        cbase = self._k("c", "")
        claims = await self._read_many(await self._lease_claims(lease))
        held: dict[str, int] = {}
        for kv in claims:
            if kv is not None:
                held[_unenc(kv.key[len(cbase) :].decode())] = json.loads(kv.value)["fence"]
        return held

    async def _lease_claims(self, lease: int) -> list[bytes]:
        """The claim keys (c/) on *lease*, as etcd lists them: what its session holds, read
        without walking the claim keys deleted since the last compaction."""
        lookup = rpc.LeaseTimeToLiveRequest(ID=lease, keys=True)
        attached = await self._call(
            "a lease lookup", lambda: self._lease.LeaseTimeToLive(lookup, timeout=self._timeout)
        )
        cbase = self._k("c", "")
        return [k for k in attached.keys if k.startswith(cbase)]

    def _drop_session(self, session: str, lease: int) -> None:
        self._sessions.pop(session, None)
        self._records.pop(session, None)
        ka = self._keepalives.pop(lease, None)
        if ka is not None:
            ka.close()

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        def apply(rec: _Rec, now: float) -> list[Any]:
            rec.updated_at = now
            rec.checkpointed = True
            return [
                _put(self._task_key(rec.id), rec.dumps()),
                _put(self._data_key(rec.id, "checkpoint"), state_json),
            ]

        self._owned.pop(task_id, None)  # the task key moves: the next write reads it
        res = await self._owner_write(expert, task_id, fence, _OWNED_S, apply)
        if res is not None:
            raise res

    async def complete(self, expert: str, items: Sequence[Completion]) -> list[FencedOut | None]:
        awaited: set[str] = set()  # completed tasks that other tasks wait for

        def apply(item: Completion) -> Callable[[_Rec, float], list[Any]]:
            def ops(rec: _Rec, now: float) -> list[Any]:
                if rec.has_waiters:
                    awaited.add(rec.id)
                out = self._unown(rec, expert)
                rec.state, rec.updated_at = "succeeded", now
                rec.event(now, "succeeded", expert)
                out += self._ended(rec)
                if len(item.result_json) <= INLINE_MAX:
                    rec.result = item.result_json
                else:
                    out.append(_put(self._data_key(rec.id, "result"), item.result_json))
                out.append(_put(self._task_key(rec.id), rec.dumps()))
                return out

            return ops

        out = await self._owner_writes(
            expert, [(i.task_id, i.fence) for i in items], _OWNED_S, lambda n: apply(items[n])
        )
        ended = [i.task_id for i, res in zip(items, out, strict=True) if res is None]
        await self._settle_many([t for t in ended if t in awaited])
        if ended:
            self._touch()  # wakes result() waiters of this process; experts watch q/ only
        return out

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]:
        for i in items:
            check_retry_delay(i.retry_delay)
        final: set[str] = set()

        def apply(item: Failure) -> Callable[[_Rec, float], list[Any]]:
            def ops(rec: _Rec, now: float) -> list[Any]:
                final.discard(rec.id)
                out = self._unown(rec, expert)
                rec.error, rec.updated_at = item.error_json, now
                if item.retry_delay is not None and rec.attempts < rec.max_attempts:
                    rec.run_at = now + item.retry_delay
                    out += self._enter_pending(rec)
                    rec.event(now, "retry", expert, f"in {item.retry_delay:.3f}s")
                else:
                    rec.state = str(
                        item.final_state if item.retry_delay is None else TaskState.DEAD
                    )
                    rec.event(now, rec.state, expert)
                    out += self._ended(rec)
                    if rec.has_waiters:
                        final.add(rec.id)
                out.append(_put(self._task_key(rec.id), rec.dumps()))
                return out

            return ops

        out = await self._owner_writes(
            expert, [(i.task_id, i.fence) for i in items], _OWNED_S, lambda n: apply(items[n])
        )
        landed = [i.task_id for i, res in zip(items, out, strict=True) if res is None]
        await self._settle_many([t for t in landed if t in final])
        if landed:
            self._touch()
        return out

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        def apply(rec: _Rec, now: float) -> list[Any]:
            ops = self._unown(rec, expert)
            rec.attempts = max(0, rec.attempts - 1)
            rec.updated_at = now
            ops += self._enter_pending(rec)
            rec.event(now, "released", expert)
            return [*ops, _put(self._task_key(rec.id), rec.dumps())]

        return await self._owner_writes(expert, items, _OWNED_S, lambda n: apply)

    async def _sweep_levels(self) -> None:
        """Drop the level keys (v/) of priority levels no pending task is at any more, so that
        claims do not read them; once a LEVEL_SWEEP (store clock). A level's tasks are counted
        from its floor after its key was read, and the key is deleted only if it has not been
        put since: a task entering the level meanwhile puts it, and the delete fails."""
        now = self._clock()
        if now - self._swept_at < LEVEL_SWEEP:
            return
        self._swept_at = now
        base = self._k("v", "")
        for kv in await self._scan(base):
            tasks = self._p + b"q/" + kv.key[len(base) :] + b"/"
            if await self._count(tasks + kv.value, _prefix_end(tasks)) == 0:
                await self._txn([_mod_is(kv.key, kv.mod_revision)], [_delete(kv.key)])

    async def _ended_sessions(self) -> list[tuple[bytes, str, list[tuple[str, bytes]]]]:
        """(marker key, session, [(task id, a/ key)]) of each session that has ended with its
        marker still there: the claims it held. Sessions are found from their x/ markers and
        the live l/ keys, read at one revision (a session's l/ key and marker are written
        together); only the a/ keys of an ended session's expert are read, not every claim of
        every expert with the deleted ones etcd keeps until compaction."""
        xbase, lbase = self._k("x", ""), self._k("l", "")
        resp = await self._txn(
            [], [_get(xbase, prefix=True, keys_only=True), _get(lbase, prefix=True)]
        )
        markers, lives = (r.response_range.kvs for r in resp.responses)
        live = {kv.key[len(lbase) :]: json.loads(kv.value)["session"] for kv in lives}
        out = []
        for kv in markers:
            expert, _, session = kv.key[len(xbase) :].decode().partition("/")
            if live.get(expert.encode()) == session:
                continue
            held = []
            abase = self._k("a", expert, "")
            for akv in await self._scan(abase):
                if akv.value.decode().partition(" ")[2] == session:
                    held.append((_unenc(akv.key[len(abase) :].decode()), akv.key))
            out.append((kv.key, session, held))
        return out

    async def expire(self) -> int:
        ended: list[str] = []

        async def one(tid: str, akey: bytes, session: str) -> tuple[bool, bool]:
            """Return one task of an ended session to pending (or dead): (moved, settled),
            settled meaning that its a/ key is gone."""
            tkey, ckey = self._task_key(tid), self._claim_key(tid)
            t = (await self._read_many([tkey]))[0]
            if t is None:
                await self._txn([], [_delete(akey)])
                return False, True
            rec = _Rec.loads(t.value)
            if rec.state not in _OWNED_S or rec.session != session:
                done = await self._txn([_mod_is(tkey, t.mod_revision)], [_delete(akey)])
                return False, bool(done.succeeded)
            now = self._clock()
            prev = rec.owner
            ops = [_delete(akey)]
            if prev is not None and self._held_key(prev, tid) != akey:
                ops.append(_delete(self._held_key(prev, tid)))
            rec.owner, rec.session, rec.lease_deadline, rec.updated_at = None, None, None, now
            if after_failure(rec.attempts, rec.max_attempts) == P:
                ops += self._enter_pending(rec)
            else:
                rec.state = "dead"
                rec.error = _error_json(
                    "LeaseExpired", f"expert {prev} lost its lease on the last attempt"
                )
                ops += self._ended(rec)
            rec.event(now, "expired", prev)
            ops.append(_put(tkey, rec.dumps()))
            resp = await self._txn([_mod_is(tkey, t.mod_revision), _absent(ckey)], ops)
            if resp.succeeded and rec.state == "dead" and rec.has_waiters:
                ended.append(tid)
            return bool(resp.succeeded), bool(resp.succeeded)

        moved = 0
        for marker, session, lapsed in await self._ended_sessions():
            settled = True
            for i in range(0, len(lapsed), 64):  # an expert that held many tasks died: in parallel
                got = await asyncio.gather(*(one(t, k, session) for t, k in lapsed[i : i + 64]))
                moved += sum(m for m, _ in got)
                settled = settled and all(s for _, s in got)
            if settled:  # every claim of the session is dealt with: forget the session
                await self._txn([], [_delete(marker)])
        await self._settle_many(ended)
        # Repair: endings whose waiters were not settled (a crash right after the ending).
        s_base = len(self._k("s", ""))
        leftovers = [
            _unenc(kv.key[s_base:].decode())
            for kv in await self._scan(self._k("s", ""), keys_only=True)
        ]
        await self._settle_many([t for t in leftovers if t not in ended])
        await self._sweep_levels()
        await self._clear_auctions()
        await self._forget_experts()
        await self._compact_old_history()
        if moved:
            self._touch()
        return moved

    async def _compact_old_history(self) -> None:
        """Compact etcd's history to the newest revision this instance saw at least
        ``compact_after`` seconds ago (store clock), at most once per ``compact_after``.

        etcd keeps every deleted key in its index until its history is compacted, and every
        read of a range walks them (an ended session's claims, a level's keys above its floor,
        the s/ and u/ markers): without compaction those reads slow down in proportion to
        everything done so far, and etcd's database grows until its quota stops all writes.
        Compaction is of the whole cluster, not only this prefix; ``compact_after=0`` leaves
        it to the operator."""
        if not self._compact_after:
            return
        now = self._clock()
        self._seen_revisions.append((now, self._rev))
        target = 0
        while self._seen_revisions and now - self._seen_revisions[0][0] >= self._compact_after:
            target = self._seen_revisions.popleft()[1]
        if target <= self._compacted:
            return
        self._compacted = target
        # One instance compacts per interval, not every expert: the first to move the marker.
        marker = self._k("compacted")
        kv = (await self._read_many([marker]))[0]
        try:
            last = float(kv.value) if kv is not None else -math.inf
        except ValueError:
            last = -math.inf
        if now - last < self._compact_after:
            return
        cmp = [_mod_is(marker, kv.mod_revision) if kv is not None else _absent(marker)]
        if not (await self._txn(cmp, [_put(marker, repr(now))])).succeeded:
            return
        req = rpc.CompactionRequest(revision=target, physical=False)
        try:
            await self._call("a compaction", lambda: self._kv.Compact(req, timeout=self._timeout))
        except StoreError as exc:
            if "compacted" not in str(exc):  # compacted past it by someone else: fine
                raise

    async def _clear_auctions(self) -> None:
        """Drop the auctions and bids of tasks that are no longer pending."""
        base = len(self._k("u", ""))
        tids = [
            _unenc(kv.key[base:].decode())
            for kv in await self._scan(self._k("u", ""), keys_only=True)
        ]
        if not tids:
            return
        recs = await self._read_many([self._task_key(t) for t in tids])
        for tid, kv in zip(tids, recs, strict=True):
            if kv is None or _Rec.loads(kv.value).state != "pending":
                cmp = [] if kv is None else [_mod_is(kv.key, kv.mod_revision)]
                await self._txn(
                    cmp,
                    [
                        _delete(self._k("u", _enc(tid))),
                        _delete(self._k("b", _enc(tid), ""), prefix=True),
                    ],
                )

    async def _forget_experts(self) -> None:
        """Remove records of experts gone for an hour; looked at once a minute (store clock)."""
        now = self._clock()
        if now - self._forgot_at < 60:
            return
        self._forgot_at = now
        for e in await self.list_experts():
            if not e.alive and e.lease_deadline < now - EXPERT_RETENTION:
                await self._txn([], [_delete(self._k("e", _enc(e.info.id)))])

    async def _settle_many(self, task_ids: Iterable[str]) -> None:
        todo = list(task_ids)
        while todo:
            todo.extend(await self._settle(todo.pop()))

    async def _settle(self, task_id: str) -> list[str]:
        """Tell the waiters of an ended task; return the waiters that died in turn."""
        t = (await self._read_many([self._task_key(task_id)]))[0]
        skey = self._k("s", _enc(task_id))
        if t is None:
            await self._txn([], [_delete(skey)])
            return []
        state = _Rec.loads(t.value).state
        base = self._k("w", _enc(task_id), "")
        died: list[str] = []
        for edge in await self._scan(base, keys_only=True):
            wid = _unenc(edge.key[len(base) :].decode())
            wkey = self._task_key(wid)
            for _ in range(WRITE_RETRIES):
                w = (await self._read_many([wkey]))[0]
                if w is None:
                    await self._txn([], [_delete(edge.key)])
                    break
                rec = _Rec.loads(w.value)
                ops = [_delete(edge.key)]
                now = self._clock()
                dies = False
                if rec.state == "waiting":
                    rec.updated_at = now
                    if state == "succeeded":
                        rec.deps_left -= 1
                        if rec.deps_left <= 0:
                            rec.run_at = max(rec.run_at, now)
                            ops += self._enter_pending(rec)
                    else:
                        dies = True
                        rec.state = "dead"
                        rec.error = _error_json(
                            "DependencyFailed", f"dependency {task_id} ended {state}"
                        )
                        rec.event(now, "dead", None, f"dependency {task_id} ended {state}")
                        ops += self._ended(rec)
                    ops.append(_put(wkey, rec.dumps()))
                resp = await self._txn(
                    [
                        _mod_is(wkey, w.mod_revision),
                        _present(edge.key),
                    ],
                    ops,
                )
                if resp.succeeded:
                    if dies and rec.has_waiters:
                        died.append(wid)
                    break
                if not (await self._read_many([edge.key]))[0]:
                    break  # someone else settled this edge
        await self._txn([], [_delete(skey)])
        return died

    # -- management ------------------------------------------------------------------------
    async def cancel(self, task_id: str) -> Task:
        tkey = self._task_key(task_id)
        for _ in range(WRITE_RETRIES):
            t = (await self._read_many([tkey]))[0]
            if t is None:
                raise TaskNotFound(task_id)
            rec = _Rec.loads(t.value)
            if not can_move(TaskState(rec.state), TaskState.CANCELLED):
                raise InvalidTransition(task_id, rec.state, "cancel")
            now = self._clock()
            prev = rec.owner
            ops: list[Any] = []
            if prev is not None:
                ops += self._unown(rec, prev)
            ops += self._leave_pending(rec)
            rec.state, rec.updated_at = "cancelled", now
            rec.event(now, "cancelled", prev)
            ops += self._ended(rec)
            ops.append(_put(tkey, rec.dumps()))
            resp = await self._txn([_mod_is(tkey, t.mod_revision)], ops)
            if resp.succeeded:
                await self._settle_many([task_id] if rec.has_waiters else [])
                self._touch()
                return await self.get(task_id)
        raise StoreError(f"task {task_id} kept changing; gave up after {WRITE_RETRIES} tries")

    async def retry(self, task_id: str) -> Task:
        tkey = self._task_key(task_id)
        for _ in range(WRITE_RETRIES):
            t = (await self._read_many([tkey]))[0]
            if t is None:
                raise TaskNotFound(task_id)
            rec = _Rec.loads(t.value)
            if rec.state not in ("failed", "dead", "cancelled"):
                raise InvalidTransition(task_id, rec.state, "retry")
            now = self._clock()
            rec.attempts, rec.run_at, rec.updated_at = 0, now, now
            ops = self._enter_pending(rec)
            rec.event(now, "retried", None)
            ops.append(_put(tkey, rec.dumps()))
            resp = await self._txn([_mod_is(tkey, t.mod_revision)], ops)
            if resp.succeeded:
                self._touch()
                return await self.get(task_id)
        raise StoreError(f"task {task_id} kept changing; gave up after {WRITE_RETRIES} tries")

    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        ttl = max(1, math.ceil(check_ttl(lease_ttl)))
        grant = await self._call(
            "a lease grant",
            lambda: self._lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl), timeout=self._timeout),
        )
        if grant.error:
            raise StoreError(f"{self._where()} refused a lease: {grant.error}")
        lease = int(grant.ID)
        granted = int(grant.TTL)
        session = uuid.uuid4().hex
        now = self._clock()
        lkey, ekey = self._k("l", _enc(info.id)), self._k("e", _enc(info.id))
        lvalue = json.dumps({"session": session, "lease": lease, "ttl": granted}).encode()
        old = (await self._read_many([ekey]))[0]
        ended: dict[str, float] = {}
        if old is not None:
            # Remember when the last sessions ended: their unexpired claims report it.
            o = json.loads(old.value)
            ended = dict(list(o.get("ended", {}).items())[-3:])
            ended[o["session"]] = _session_deadline(o)
        record = {
            "info": info.to_json_text(),
            "session": session,
            "lease": lease,
            "ttl": granted,
            "started_at": now,
            "heartbeat_at": now,
            "ended_at": None,
            "ended": ended,
            "load": 0,
            "claim_attempts": 0,
            "claims_won": 0,
            "tasks_done": 0,
        }
        resp = await self._txn(
            [_absent(lkey)],
            [
                _put(lkey, lvalue, lease),
                _put(ekey, json.dumps(record)),
                _put(self._k("x", _enc(info.id), session), b""),
            ],
            [_get(ekey)],
        )
        if not resp.succeeded:
            await self._revoke(lease)
            kvs = resp.responses[0].response_range.kvs
            other = ExpertInfo.from_json_text(json.loads(kvs[0].value)["info"]) if kvs else info
            raise ExpertConflict(
                f"expert id {info.id!r} is live elsewhere (host {other.host or '?'}, "
                f"pid {other.pid}); pick another --name or stop that expert"
            )
        self._remember(session, lease, lvalue)
        self._records[session] = record
        return session

    async def _revoke(self, lease: int) -> None:
        try:
            await self._call(
                "a lease revoke",
                lambda: self._lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=lease), timeout=self._timeout
                ),
            )
        except StoreError as exc:
            if "not found" not in str(exc):
                raise

    async def deregister_expert(self, expert: str, session: str) -> None:
        lkey, ekey = self._k("l", _enc(expert)), self._k("e", _enc(expert))
        lkv, ekv = await self._read_many([lkey, ekey])
        if lkv is None or json.loads(lkv.value)["session"] != session or ekv is None:
            return
        d = json.loads(ekv.value)
        d.update(load=0, ended_at=self._clock() - 1e-6)
        await self._txn([_value_is(lkey, lkv.value)], [_put(ekey, json.dumps(d))])
        lease = int(json.loads(lkv.value)["lease"])
        self._drop_session(session, lease)
        await self._revoke(lease)

    async def end_session(self, expert: str) -> bool:
        """Fault injection (tests, drills): revoke the etcd lease of *expert*'s live session,
        as if it had run out. Its claims vanish at once. Returns False when it had none."""
        kv = (await self._read_many([self._k("l", _enc(expert))]))[0]
        if kv is None:
            return False
        await self._revoke(int(json.loads(kv.value)["lease"]))
        return True

    async def purge_all(self) -> None:
        """Delete every task, expert and index under this store's prefix (benchmarks, tests).
        Live sessions end with it: their session keys are gone."""
        meta = self._k("meta")
        await self._txn(
            [],
            [_delete(self._p, end=meta), _delete(meta + b"\0", end=_prefix_end(self._p))],
        )
        self._touch()

    async def compact_history(self, timeout: float = 600.0) -> int:
        """Compact etcd's history up to now (every key of the cluster, not only this prefix)
        and wait until it is done; returns the revision. A task store rewrites and deletes
        keys all the time, and etcd keeps every old revision until compacted: run etcd with
        ``--auto-compaction-retention``; this is for benchmarks and tools that start from a
        clean slate. Watches behind the compacted revision restart from now."""
        resp = await self._range(self._k("meta"))
        rev = int(resp.header.revision)
        req = rpc.CompactionRequest(revision=rev, physical=True)
        try:
            await self._call("a compaction", lambda: self._kv.Compact(req, timeout=timeout))
        except StoreError as exc:
            if "compacted" not in str(exc):  # already compacted to here by someone else: fine
                raise
        return rev

    # -- wake-ups --------------------------------------------------------------------------
    def _touch(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_change(self, timeout: float) -> None:
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(self._watch())
        if self._version == self._seen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        self._seen = self._version

    async def _watch(self) -> None:
        """Watch the pending index for new keys, from just after the last revision this client
        saw (so nothing written since is missed); resume where it stopped when the stream
        breaks, with back-off."""
        pause = 0.05
        prefix = self._k("q", "")
        start = self._rev + 1 if self._rev else 0
        while self._channel is not None:
            call = self._watch_stub.Watch()
            try:
                create = rpc.WatchCreateRequest(
                    key=prefix,
                    range_end=_prefix_end(prefix),
                    filters=[rpc.WatchCreateRequest.NODELETE],
                    start_revision=start,
                )
                await call.write(rpc.WatchRequest(create_request=create))
                while True:
                    resp = await call.read()
                    if resp is None or not isinstance(resp, rpc.WatchResponse):
                        break
                    if resp.created:
                        pause = 0.05
                    if resp.compact_revision:
                        # History was compacted past where we stopped: changes may have been
                        # missed, so wake the waiters and watch from now on.
                        start = 0
                        self._touch()
                        break
                    if resp.events:
                        start = resp.events[-1].kv.mod_revision + 1
                        self._touch()
                    if resp.canceled:
                        break
            except rpc.AioRpcError:
                pass
            finally:
                call.cancel()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def bid(
        self, expert: str, session: str, task_id: str, score: float, window: float
    ) -> Auction:
        score, window = check_bid(score, window)
        tkey, ukey = self._task_key(task_id), self._k("u", _enc(task_id))
        bids_prefix = self._k("b", _enc(task_id), "")
        mine = self._k("b", _enc(task_id), _enc(expert))
        for _ in range(WRITE_RETRIES):
            _, session_value = await self._session(expert, session)
            resp = await self._txn([], [_get(tkey), _get(ukey), _get(bids_prefix, prefix=True)])
            t, u, bids = (r.response_range.kvs for r in resp.responses)
            now = self._clock()
            if not t:
                raise TaskNotFound(task_id)
            closes = json.loads(u[0].value)["closes_at"] if u else now + window
            if _Rec.loads(t[0].value).state != "pending":
                return Auction(task_id, now, closes if u else now, (), open=False)
            placed = {
                _unenc(kv.key[len(bids_prefix) :].decode()): json.loads(kv.value) for kv in bids
            }
            old = placed.get(expert)
            placed[expert] = {"score": score, "at": old["at"] if old else now}
            cmp = [
                _mod_is(tkey, t[0].mod_revision),
                _value_is(self._k("l", _enc(expert)), session_value),
                _mod_is(ukey, u[0].mod_revision) if u else _absent(ukey),
            ]
            ops = [] if u else [_put(ukey, json.dumps({"closes_at": closes}))]
            if old is None or old["score"] != score:
                ops.append(_put(mine, json.dumps(placed[expert])))
            if (await self._txn(cmp, ops)).succeeded:
                ranked = rank_bids({e: (b["score"], b["at"]) for e, b in placed.items()})
                return Auction(task_id, now, closes, ranked)
        raise StoreError(f"the auction of task {task_id} kept changing; gave up")

    async def _every_level(self, queues: Sequence[str]) -> list[tuple[bytes, bytes]]:
        """(tasks' prefix, floor) of every priority level of these queues."""
        listed = await asyncio.gather(*(self._levels(q) for q in dict.fromkeys(queues)))
        return [
            (self._k("q", _enc(q), inv, ""), floor)
            for q, levels in zip(dict.fromkeys(queues), listed, strict=True)
            for inv, floor, _ in levels
        ]

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        now = self._clock()
        due_by = f"{_micros(now) + 1:017d}".encode()

        async def level(prefix: bytes, floor: bytes) -> tuple[int, float | None]:
            if prefix + floor >= prefix + due_by:
                return 0, None
            # One read gives both: etcd counts the whole range whatever the limit.
            head = await self._range(prefix + floor, prefix + due_by, limit=1, keys_only=True)
            due = int(head.kvs[0].key[len(prefix) :][:17]) / 1_000_000 if head.kvs else None
            return int(head.count), due

        found = await asyncio.gather(*(level(*x) for x in await self._every_level(queues)))
        dues = [due for _, due in found if due is not None]
        return Backlog(sum(n for n, _ in found), max(0.0, now - min(dues)) if dues else None)

    async def next_due(self, queues: Sequence[str]) -> float | None:
        async def level(prefix: bytes, floor: bytes) -> float | None:
            kvs, _ = await self._read_index(prefix, prefix + floor, 1, 1, _any, b"\0first")
            return int(kvs[0].key[len(prefix) :][:17]) / 1_000_000 if kvs else None

        found = await asyncio.gather(*(level(*x) for x in await self._every_level(queues)))
        return min((due for due in found if due is not None), default=None)


class _KeepAlive:
    """One long-lived ``LeaseKeepAlive`` stream for one lease: each refresh() sends one request
    and reads one answer. The stream is reopened once when it broke (etcd restarted)."""

    def __init__(self, store: EtcdStore, lease: int) -> None:
        self._store = store
        self._lease = lease
        self._call: Any = None
        self._lock = asyncio.Lock()

    async def refresh(self) -> int:
        """Send one keep-alive; return the TTL etcd granted (0 when the lease is gone)."""
        async with self._lock:
            for attempt in range(2):
                if self._call is None:
                    self._call = self._store._lease.LeaseKeepAlive()
                try:
                    await asyncio.wait_for(
                        self._call.write(rpc.LeaseKeepAliveRequest(ID=self._lease)),
                        self._store._timeout,
                    )
                    resp = await asyncio.wait_for(self._call.read(), self._store._timeout)
                except Exception as exc:  # a broken stream raises several kinds; reopen it
                    self.close()
                    if attempt == 1:
                        raise StoreError(
                            f"cannot renew lease {self._lease:x} at {self._store._where()}: {exc}"
                        ) from exc
                    continue
                if resp is None or not isinstance(resp, rpc.LeaseKeepAliveResponse):
                    self.close()
                    continue
                return int(resp.TTL)
        raise StoreError(f"the keep-alive stream of lease {self._lease:x} keeps closing")

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None


_OWNED_S = frozenset({"claimed", "running"})


def _session_deadline(record: dict[str, Any]) -> float:
    """When an expert record's session ends: its last heartbeat plus the TTL, or earlier when
    it was deregistered."""
    deadline = float(record["heartbeat_at"] + record["ttl"])
    ended_at = record.get("ended_at")
    return deadline if ended_at is None else min(deadline, float(ended_at))


_BAD_END = frozenset({"failed", "dead", "cancelled"})


def _unenc(text: str) -> str:
    return unquote(text)
