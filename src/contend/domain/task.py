"""Tasks, their states and the transitions between them.

::

    submit ──► waiting ──(deps done)──► pending ◄──────────────┐
                                   │  ▲                       │ retry after back-off
                         claim ────┘  │ lease expired /       │ (attempts remain)
                                   ▼  │ released              │
                                claimed ──start──► running ───┼──► succeeded
                                   │                 │        └──► failed (not retryable)
                                   └───────┬─────────┘             dead   (attempts spent)
                                        cancel ───────────────────► cancelled

Attempts are counted at claim time, so a crash that kills the expert (its lease runs out) uses an
attempt just as a raised exception does; a graceful release gives the attempt back.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from contend.domain.limits import Rate, check_limits

# The payload and name rules live in domain.payload; code and tests have long imported them here.
from contend.domain.payload import JSON as JSON
from contend.domain.payload import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from contend.domain.payload import MAX_KEY_CHARS as MAX_KEY_CHARS
from contend.domain.payload import MAX_NAME_CHARS as MAX_NAME_CHARS
from contend.domain.payload import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from contend.domain.payload import check_name as check_name
from contend.domain.payload import check_queue as check_queue
from contend.domain.payload import decode_json as decode_json
from contend.domain.payload import encode_json as encode_json
from contend.domain.payload import parse_json as parse_json
from contend.domain.payload import text_problem as text_problem
from contend.errors import PayloadError, TaskError, shown


class TaskState(StrEnum):
    PENDING = "pending"
    WAITING = "waiting"
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def owned(self) -> bool:
        return self in OWNED_STATES


TERMINAL_STATES = frozenset(
    {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED}
)
OWNED_STATES = frozenset({TaskState.CLAIMED, TaskState.RUNNING})

#: Every allowed move; a backend must refuse any other.
TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    TaskState.WAITING: frozenset({TaskState.PENDING, TaskState.CANCELLED, TaskState.DEAD}),
    TaskState.PENDING: frozenset({TaskState.CLAIMED, TaskState.RUNNING, TaskState.CANCELLED}),
    TaskState.CLAIMED: frozenset(
        {
            TaskState.RUNNING,
            TaskState.PENDING,
            TaskState.CANCELLED,
            TaskState.DEAD,
            TaskState.SUCCEEDED,
            TaskState.FAILED,
        }
    ),
    TaskState.RUNNING: frozenset(
        {
            TaskState.SUCCEEDED,
            TaskState.FAILED,
            TaskState.DEAD,
            TaskState.PENDING,
            TaskState.CANCELLED,
        }
    ),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset({TaskState.PENDING}),
    TaskState.DEAD: frozenset({TaskState.PENDING}),
    TaskState.CANCELLED: frozenset({TaskState.PENDING}),
}


def can_move(src: TaskState, dst: TaskState) -> bool:
    return dst in TRANSITIONS[src]


class IfFailed(StrEnum):
    """What a dependency that ends without succeeding (failed, dead or cancelled) does to the
    task waiting on it: one choice per edge."""

    FAIL = "fail"  # the task dies, its error naming the dependency (the default)
    CANCEL = "cancel"  # the task is cancelled, its history saying why
    RUN = "run"  # the edge counts as done: the task runs once its other dependencies are


def check_if_failed(depends_on: Sequence[str], if_failed: Iterable[object]) -> tuple[str, ...]:
    """The per-edge choices of a task, aligned with *depends_on*, as a store keeps them: ``()``
    when every edge is ``fail`` (the default needs no room). TaskError when one is not a choice
    or they are not one per dependency."""
    given = tuple(if_failed)
    if not given:
        return ()
    if len(given) != len(depends_on):
        raise TaskError(
            f"if_failed gives {len(given)} choices for {len(depends_on)} dependencies: "
            "give one per dependency"
        )
    for choice in given:
        if choice not in _CHOICES:
            raise TaskError(f"if_failed must be one of {', '.join(_CHOICES)}, got {shown(choice)}")
    out = tuple(str(c) for c in given)
    return () if all(c == IfFailed.FAIL for c in out) else out


_CHOICES = tuple(str(c) for c in IfFailed)


def if_failed_of(depends_on: Sequence[str], if_failed: Sequence[str], dependency: str) -> str:
    """The choice of the edge to *dependency* (``fail`` for an edge without one)."""
    if not if_failed:
        return IfFailed.FAIL
    try:
        return if_failed[depends_on.index(dependency)]
    except (ValueError, IndexError):
        return IfFailed.FAIL


_last_id = 0
_last_id_lock = threading.Lock()


def new_task_id(now: float | None = None) -> str:
    """A 28-character hex id that sorts by creation time: 48-bit milliseconds, 64 random bits.

    Ids made by one process are strictly increasing, also within one millisecond (the random
    part then counts up, as monotonic ULIDs do): stores break ties between tasks due at the same
    moment by id, so this is what keeps a batch first-in-first-out.
    """
    global _last_id
    ms = int((time.time() if now is None else now) * 1000)
    value = (ms << 64) | int.from_bytes(os.urandom(8), "big")
    with _last_id_lock:
        if value >> 64 <= _last_id >> 64:
            value = _last_id + 1
        _last_id = value
    return f"{value:028x}"


@dataclass(frozen=True, slots=True)
class Requirements:
    """What a task needs from an expert: capability tags and amounts of named resources (hard:
    an expert without them never claims the task), and preferred tags such as ``zone:eu``
    (soft: experts without them may run it, but score lower and wait longer in the race)."""

    tags: frozenset[str] = frozenset()
    resources: Mapping[str, float] = field(default_factory=dict)
    prefer: frozenset[str] = frozenset()

    @classmethod
    def of(cls, value: Requirements | Iterable[str] | Mapping[str, Any] | None) -> Requirements:
        if value is None:
            return NO_REQUIREMENTS
        if isinstance(value, Requirements):
            return value
        if isinstance(value, Mapping):
            tags = value.get("tags", ())
            res = value.get("resources", {})
            unknown = set(value) - {"tags", "resources", "prefer"}
            if unknown:
                raise TaskError(f"requirements have unknown keys: {shown(sorted(unknown))}")
            return cls(_tags(tags), _resources(res), _tags(value.get("prefer", ())))
        return cls(_tags(value), {})

    @property
    def empty(self) -> bool:
        return not self.tags and not self.resources and not self.prefer

    def to_json(self) -> JSON:
        if self.empty:
            return None
        data: dict[str, JSON] = {
            "tags": sorted(self.tags),
            "resources": dict(sorted(self.resources.items())),
        }
        if self.prefer:
            data["prefer"] = sorted(self.prefer)
        return data

    @classmethod
    def from_json(cls, data: JSON) -> Requirements:
        return cls.of(data)


NO_REQUIREMENTS = Requirements()


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an expert offers: tags (``gpu``, ``zone:eu``) and resource amounts (``mem_gb=16``)."""

    tags: frozenset[str] = frozenset()
    resources: Mapping[str, float] = field(default_factory=dict)

    def satisfies(self, req: Requirements) -> bool:
        if not req.tags <= self.tags:
            return False
        return all(self.resources.get(name, 0.0) >= need for name, need in req.resources.items())

    def match_score(self, req: Requirements) -> float:
        """1.0 for a bare fit, lower when the expert offers much more than asked (keep big
        machines for big tasks); 0.0 when it cannot run the task at all."""
        if not self.satisfies(req):
            return 0.0
        if not self.tags and not self.resources:
            return 1.0
        spare_tags = len(self.tags - req.tags) / max(1, len(self.tags))
        return 1.0 - 0.25 * spare_tags

    def to_json(self) -> JSON:
        return {"tags": sorted(self.tags), "resources": dict(sorted(self.resources.items()))}

    @classmethod
    def parse(cls, items: Iterable[str]) -> Capabilities:
        """Parse CLI items: ``gpu`` is a tag, ``mem_gb=16`` a resource amount."""
        tags: set[str] = set()
        res: dict[str, float] = {}
        for item in items:
            if "=" in item:
                name, _, amount = item.partition("=")
                try:
                    value = float(amount)
                except ValueError as exc:
                    raise TaskError(f"capability {shown(item)}: amount must be a number") from exc
                res[_name(name)] = _amount(name, value)
            else:
                tags.add(_name(item))
        return cls(frozenset(tags), res)


def _name(value: object) -> str:
    return check_name(value, "a tag or resource name").strip()


def _amount(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TaskError(f"resource {shown(name)} must be a finite number, got {shown(value)}")
    if value < 0:
        raise TaskError(f"resource {shown(name)} must not be negative, got {shown(value)}")
    return float(value)


def _tags(value: object) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset({_name(value)})
    if not isinstance(value, Iterable):
        raise TaskError(f"requirement tags must be a list of strings, got {shown(value)}")
    return frozenset(_name(v) for v in value)


def _resources(value: object) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise TaskError(f"requirement resources must be a mapping, got {shown(value)}")
    return {_name(k): _amount(k, v) for k, v in value.items()}


#: Priorities are integers in this range; higher runs first.
MIN_PRIORITY, MAX_PRIORITY = -1_000_000, 1_000_000


def effective_priority(priority: int, age_seconds: float, ageing: float = 1.0) -> float:
    """Seed 002 weighs a task by ``base × log(age + 1)``, which leaves priority 0 at 0 for ever
    and turns negative priorities more negative with age. This keeps its shape and is sound for
    every base: the age term is added, so every task gains ``ageing × ln(1 + age)`` and an old
    low-priority task eventually overtakes fresh high-priority ones."""
    return priority + ageing * math.log1p(max(0.0, age_seconds))


#: Ageing rate of the stores: a pending task gains one priority step at ages e^1-1, e^2-1, …
#: seconds (1.7 s, 6.4 s, 19 s, 53 s, 2.5 min, 6.7 min, 18 min, 50 min, 2.3 h, 6.1 h, …).
#:
#: A task's age is reckoned from its due time (``run_at``), not its creation: it is the time
#: the task has waited while it could have run. So a delayed or retried task does not jump
#: ahead of tasks of its priority that were due before it, and within one priority level
#: ageing never changes the claim order (eff_priority DESC, run_at, id). A store whose tasks
#: all have priority 0 may therefore skip the ageing writes: a store that keeps effective
#: priorities in its rows writes none until a task of a priority other than 0 was ever
#: submitted to it (they cost about a fifth of a 100,000-task drain on PostgreSQL), and its
#: first sweep after that catches every waiting task up from its due time.
AGEING = 1.0


def aged_priority(priority: int, age_seconds: float, ageing: float = AGEING) -> int:
    """:func:`effective_priority` in whole steps, as stores keep it for ordering."""
    return math.floor(effective_priority(priority, age_seconds, ageing))


def next_promotion(priority: int, aged: int, due_at: float, ageing: float = AGEING) -> float:
    """When a task due at *due_at* and now at *aged* gains its next step."""
    exponent = (aged - priority + 1) / ageing
    return due_at + (math.expm1(exponent) if exponent < 60 else 1e12)


#: How long after its due time a task gains its first step (e - 1 s at the default rate).
FIRST_STEP = next_promotion(0, 0, 0.0)


def unaged(priority: int, due_at: float) -> tuple[int, float]:
    """(effective priority, next promotion) of a task that is due at *due_at* and has not
    waited yet: what a store writes whenever it sets a task's due time (submit, retry, a
    dependency's release), so that the age restarts from the new due time."""
    return priority, due_at + FIRST_STEP


#: Share of claims that go to the tasks that have waited longest among those below the top
#: priority (seed 000 §6): high-priority floods cannot starve lower-priority work.
LOW_LANE_SHARE = 0.1
#: How many base priority levels below the top a low-lane claim looks at, per queue.
LANE_LEVELS = 64


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One submission, validated: everything a store needs to insert a task."""

    type: str
    args_json: str = "[]"
    kwargs_json: str = "{}"
    queue: str = "default"
    priority: int = 0
    key: str | None = None
    requirements: Requirements = NO_REQUIREMENTS
    delay: float = 0.0
    max_attempts: int = 3
    timeout: float | None = None
    depends_on: tuple[str, ...] = ()
    #: What each dependency does to the task if it does not succeed (:class:`IfFailed`),
    #: aligned with ``depends_on``; ``()``: every edge ``fail``.
    if_failed: tuple[str, ...] = ()
    id: str = field(default_factory=new_task_id)
    #: The submitter's trace context (W3C ``traceparent``/``tracestate``) as JSON text, for
    #: the expert's spans to join the submitter's trace; None when there is none.
    trace: str | None = None
    #: At most ``concurrency_limit`` tasks of ``limit_key`` claimed or running at once
    #: (``contend.domain.limits``); None: no limit.
    limit_key: str | None = None
    concurrency_limit: int | None = None
    #: Starts of ``limit_key`` at most at this rate (``contend.domain.limits.Rate``).
    rate_limit: Rate | None = None
    #: Claims share the slots fairly among the keys of a queue (``fair_order``).
    fair: bool = False
    #: A task of a ``central`` queue: claimable only by the expert its queue's leader
    #: assigned it to (``contend.domain.dispatch``).
    central: bool = False

    @classmethod
    def build(
        cls,
        type: str,
        args: Sequence[JSON] = (),
        kwargs: Mapping[str, JSON] | None = None,
        *,
        queue: str = "default",
        priority: int = 0,
        key: str | None = None,
        requirements: Requirements | Iterable[str] | Mapping[str, Any] | None = None,
        delay: float = 0.0,
        max_attempts: int = 3,
        timeout: float | None = None,
        depends_on: Iterable[str] = (),
        limit: int = MAX_PAYLOAD_BYTES,
        trace: Mapping[str, str] | None = None,
        limit_key: str | None = None,
        concurrency_limit: int | None = None,
        if_failed: Iterable[str] = (),
        rate_limit: Rate | None = None,
        fair: bool = False,
        central: bool = False,
    ) -> TaskSpec:
        """Validate a submission; raises :class:`TaskError` naming the first problem.
        *if_failed*: one :class:`IfFailed` choice per dependency (none: all ``fail``)."""
        check_name(type, "task type")
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise PayloadError(f"args must be a JSON array (a list), got {shown(args)}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise PayloadError(f"kwargs must be a JSON object (a dict), got {shown(kwargs)}")
        args_json = encode_json(list(args), "args", limit)
        kwargs_json = encode_json(dict(kwargs or {}), "kwargs", limit)
        if len(args_json) + len(kwargs_json) > limit:
            raise PayloadError(f"args and kwargs together exceed the {limit}-byte payload limit")
        check_queue(queue)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TaskError(f"priority must be an integer, got {shown(priority)}")
        if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise TaskError(
                f"priority {shown(priority)} is outside [{MIN_PRIORITY}, {MAX_PRIORITY}]"
            )
        if key is not None:
            check_name(key, "idempotency key", MAX_KEY_CHARS)
        if not _finite_nonneg(delay) or delay > 366 * 86400:
            raise TaskError(f"delay must be between 0 and one year in seconds, got {shown(delay)}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise TaskError(f"max_attempts must be an integer, got {shown(max_attempts)}")
        if not 1 <= max_attempts <= 1000:
            raise TaskError(f"max_attempts must be between 1 and 1000, got {max_attempts}")
        if timeout is not None and (not _finite_nonneg(timeout) or timeout == 0):
            raise TaskError(f"timeout must be a positive number of seconds, got {shown(timeout)}")
        lkey, climit, rate, fair = check_limits(limit_key, concurrency_limit, rate_limit, fair)
        deps, choices = _edges(tuple(depends_on), tuple(if_failed))
        return cls(
            type=type,
            args_json=args_json,
            kwargs_json=kwargs_json,
            queue=queue,
            priority=priority,
            key=key,
            requirements=Requirements.of(requirements),
            delay=float(delay),
            max_attempts=max_attempts,
            timeout=None if timeout is None else float(timeout),
            depends_on=deps,
            if_failed=choices,
            trace=check_trace(trace),
            limit_key=lkey,
            concurrency_limit=climit,
            rate_limit=rate,
            fair=fair,
            central=central is True,
        )

    def if_failed_of(self, dependency: str) -> str:
        """The choice of the edge to *dependency*."""
        return if_failed_of(self.depends_on, self.if_failed, dependency)


def _edges(
    deps: tuple[str, ...], choices: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The dependencies, each once, and their choices; a dependency named twice with two
    different choices is refused."""
    for dep in deps:
        if not isinstance(dep, str) or not dep or text_problem(dep) is not None:
            raise TaskError(f"a dependency must be a task id, got {shown(dep)}")
    full = check_if_failed(deps, choices) or (str(IfFailed.FAIL),) * len(deps)
    chosen: dict[str, str] = {}
    for dep, choice in zip(deps, full, strict=True):
        if chosen.setdefault(dep, choice) != choice:
            raise TaskError(
                f"dependency {shown(dep)} is given twice, with if_failed "
                f"{shown(chosen[dep])} and {shown(choice)}"
            )
    unique = tuple(chosen)
    return unique, check_if_failed(unique, chosen.values())


#: The most a trace context may hold, characters of JSON.
MAX_TRACE_CHARS = 1024


def check_trace(carrier: Mapping[str, str] | None) -> str | None:
    """A trace context (a few short string fields) as JSON text; TaskError when it is not."""
    if carrier is None or not carrier:
        return None
    if not isinstance(carrier, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()
    ):
        raise TaskError(f"a trace context must map strings to strings, got {shown(carrier)}")
    text = encode_json(dict(carrier), "trace context")
    if len(text) > MAX_TRACE_CHARS:
        raise TaskError(f"a trace context must be at most {MAX_TRACE_CHARS} characters of JSON")
    return text


def load_trace(text: str | None) -> dict[str, str] | None:
    """The trace context a store kept (see :func:`check_trace`)."""
    if not text:
        return None
    value = parse_json(text, "trace context")
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


def check_progress(done: object, total: object, note: object) -> dict[str, JSON]:
    """What ``ctx.progress(done, total, note)`` stores: TaskError for values out of shape."""
    if isinstance(done, bool) or not isinstance(done, int | float) or not _finite_nonneg(done):
        raise TaskError(f"progress done must be a number >= 0, got {shown(done)}")
    if total is not None and (
        isinstance(total, bool) or not isinstance(total, int | float) or not _finite_nonneg(total)
    ):
        raise TaskError(f"progress total must be None or a number >= 0, got {shown(total)}")
    if note is not None and (not isinstance(note, str) or text_problem(note) is not None):
        raise TaskError(f"progress note must be text, got {shown(note)}")
    return {"done": done, "total": total, "note": None if note is None else note[:500]}


def _finite_nonneg(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """One line of a task's history."""

    at: float
    event: str  # submitted, claimed, started, checkpoint, succeeded, failed, retry, expired, ...
    fence: int
    expert: str | None = None
    detail: str | None = None

    def to_json(self) -> JSON:
        return {
            "at": self.at,
            "event": self.event,
            "fence": self.fence,
            "expert": self.expert,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Task:
    """A task as a store reports it (a read model; changing it changes nothing)."""

    id: str
    type: str
    queue: str
    state: TaskState
    priority: int
    args: list[JSON]
    kwargs: dict[str, JSON]
    key: str | None
    requirements: Requirements
    attempts: int
    max_attempts: int
    fence: int
    owner: str | None
    lease_deadline: float | None
    run_at: float
    created_at: float
    updated_at: float
    timeout: float | None = None
    result: JSON = None
    error: JSON = None
    checkpoint: JSON = None
    depends_on: tuple[str, ...] = ()
    history: tuple[TaskEvent, ...] = ()
    #: The last ``ctx.progress()`` of a run: ``{"done", "total", "note"}``, or None.
    progress: JSON = None
    trace: dict[str, str] | None = None
    #: The choice of each edge, aligned with ``depends_on`` (``()``: every edge ``fail``).
    if_failed: tuple[str, ...] = ()
    #: Its limit key, the most of that key's tasks to be claimed or running at once, and
    #: whether it shares its queue's slots fairly among keys (``@app.task(limit_key=…)``).
    limit_key: str | None = None
    concurrency_limit: int | None = None
    fair: bool = False

    def if_failed_of(self, dependency: str) -> str:
        """The choice of the edge to *dependency*."""
        return if_failed_of(self.depends_on, self.if_failed, dependency)

    def to_json(self) -> dict[str, JSON]:
        return {
            "id": self.id,
            "type": self.type,
            "queue": self.queue,
            "state": str(self.state),
            "priority": self.priority,
            "args": self.args,
            "kwargs": self.kwargs,
            "key": self.key,
            "requirements": self.requirements.to_json(),
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "fence": self.fence,
            "owner": self.owner,
            "lease_deadline": self.lease_deadline,
            "run_at": self.run_at,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "timeout": self.timeout,
            "result": self.result,
            "error": self.error,
            "checkpoint": self.checkpoint,
            "progress": self.progress,
            "depends_on": list(self.depends_on),
            "if_failed": [self.if_failed_of(d) for d in self.depends_on],
            "limit_key": self.limit_key,
            "concurrency_limit": self.concurrency_limit,
            "fair": self.fair,
            "history": [e.to_json() for e in self.history],
        }


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """Return one dependency cycle (ids, the first repeated last), or None when there is none."""
    done: set[str] = set()
    for root in edges:
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [iter(edges.get(root, ()))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                node = path.pop()
                on_path.discard(node)
                done.add(node)
                stack.pop()
            elif nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(edges.get(nxt, ())))
    return None
