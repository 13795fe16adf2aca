"""The task record under ``t/{task}`` and its codec, the priority index's values, and the
domain Task a record is shown as."""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass
from typing import Any

import orjson

from contend.domain.task import JSON, Requirements, Task, TaskEvent, TaskState, load_trace

#: Keep at most this many history events in a task record (it is rewritten at every change).
HISTORY_LIMIT = 50
#: Payloads up to this many characters are kept in the task record, not in a d/ key of their own.
INLINE_MAX = 1024
#: What the compact JSON of an index value holds for "no requirements": no need to parse it.
REQ_NONE = b'"req":null'
#: What the JSON of an index value of a task with a limit key holds, before its key.
LIM = b'"lim":'

COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


@dataclass(slots=True)
class Record:
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
    progress: str | None = None  # the last ctx.progress() JSON text (small: kept inline)
    trace: str | None = None  # the submitter's trace context, JSON text
    # A bid opened an auction on it (u/{id}, auctions.py): a claim reads the auction and keeps
    # its order. Set by the bid that finds it unset, in the Txn that compares the record: so
    # a claim that read the record without it knows no auction opened before its Txn.
    auctioned: bool = False
    # What each dependency edge does if its dependency does not succeed, aligned with
    # depends_on (None: every edge fails, as every edge of an older record does).
    if_failed: list[str] | None = None
    # Its limit key and concurrency limit, [limit key, limit or None] (contend.domain.limits),
    # as submitted; None: no limit key (every record written before limits were kept). While
    # the task is claimed or running it has a holder key n/{limit key}/{id} (outcomes.py),
    # which claims count (for its concurrency limit, and for fair share).
    limit: list[Any] | None = None
    # The rate its submission declared for its limit key, [interval, burst]; the key's rate
    # and state live in r/{limit key} (claims read that: the latest declared rate holds back
    # every task of the key). None: none declared (every record written before rates).
    rate: list[Any] | None = None
    # Claims share the slots fairly among the limit keys of fair tasks (fair_order).
    fair: bool = False
    # A task of a central queue (contend.domain.dispatch): indexed under z/, not q/, and
    # claimable by its assignee alone (dispatch.py). Its assignee is the expert the queue's
    # leader gave it to, until a claim (or any move out of pending) uses the assignment up.
    central: bool = False
    assignee: str | None = None

    def dumps(self) -> bytes:
        # orjson writes and reads a record four to seven times as fast as the json module;
        # json takes what orjson refuses (an integer beyond 64 bits in a requirement).
        fields = _record_fields(self)
        try:
            return orjson.dumps(fields)
        except TypeError:
            return COMPACT_JSON.encode(fields).encode()

    @classmethod
    def loads(cls, data: bytes) -> Record:
        try:
            return cls(*orjson.loads(data))
        except orjson.JSONDecodeError:
            return cls(*json.loads(data))

    @property
    def limit_key(self) -> str | None:
        return None if self.limit is None else str(self.limit[0])

    @property
    def concurrency_limit(self) -> int | None:
        """Its concurrency limit, if it has one (a rate or fair share alone: None)."""
        return None if self.limit is None or self.limit[1] is None else int(self.limit[1])

    def event(self, now: float, event: str, expert: str | None, detail: str | None = None) -> None:
        self.history.append([now, event, self.fence, expert, detail])
        if len(self.history) > HISTORY_LIMIT:
            del self.history[1 : len(self.history) - HISTORY_LIMIT + 1]


_record_fields = operator.attrgetter(*Record.__slots__)


@dataclass(slots=True)
class KV:
    """A key as this instance wrote it (stands in for an etcd KeyValue it did not read)."""

    key: bytes
    value: bytes
    mod_revision: int


def index_value(rec: Record) -> bytes:
    """``{created_at} {"type", "req"[, "lim"]}``: the value of a pending task's priority-index
    key, the creation time first, where a claim ranking candidates reads it without parsing
    JSON; ``lim``, the limit key, only for a task with one (so that a claim can pass over the
    tasks of a key it found with no room without reading their records). A fair task's key is
    in its level's name instead (keys.py)."""
    d: dict[str, Any] = {"type": rec.type, "req": rec.req}
    if rec.limit is not None:
        d["lim"] = rec.limit[0]
    return f"{rec.created_at!r} {COMPACT_JSON.encode(d)}".encode()


def index_json(value: bytes) -> dict[str, Any]:
    """The JSON part of a priority-index value (after the creation time)."""
    parsed: dict[str, Any] = json.loads(value[value.index(b" ") + 1 :])
    return parsed


def index_limit_key(value: bytes) -> str | None:
    """The limit key a priority-index value holds, if any (parsed only when it may)."""
    if LIM not in value:
        return None
    key = index_json(value).get("lim")
    return None if key is None else str(key)


def _load(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


def task_of(
    rec: Record,
    args: tuple[list[JSON], dict[str, JSON]] | None,
    result: JSON = None,
    checkpoint: JSON = None,
    history: bool = False,
    lease_deadline: float | None = None,
) -> Task:
    """The domain Task *rec* is, with its payloads."""
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
        progress=_load(rec.progress),
        trace=load_trace(rec.trace),
        if_failed=tuple(rec.if_failed or ()),
        limit_key=rec.limit_key,
        concurrency_limit=rec.concurrency_limit,
        fair=rec.fair and rec.limit is not None,
    )
