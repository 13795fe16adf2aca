"""Pipelines: stages joined by queues, each stage its own task type, queue and expert group
(seed 000 §3.2: extract → transform → load, each scaled on its own).

A stage's function takes one list of records and returns the list for the next stage. The
expert that ran it submits the output, cut into tasks of ``batch`` records, to the next
stage's queue before it commits the run; each of those tasks has an idempotency key made of
the parent's id and its place, so a run repeated after a crash forwards nothing twice. The
last stage's return value is its task's result.

Back-pressure: an expert claims no task of a stage while the next stage's queue holds more
than ``limit`` pending tasks, and takes it up again once that falls below 90 % of the limit;
so a slow stage holds the ones above it, and backlog and memory stay bounded whatever the
speed of the source. :class:`Gate` keeps that picture, read from the store at most every
:data:`GATE_EVERY` seconds (:data:`GATE_EVERY_CLOSED` while a stage waits), and counts in
between what this expert itself sent on.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from contend.domain.task import JSON, TaskSpec, TaskState
from contend.errors import ConfigError, TaskError, shown
from contend.runtime.clock import Clock
from contend.store.port import Store, StoreStats

if TYPE_CHECKING:
    from contend.runtime.app import App, TaskHandle
    from contend.runtime.task_type import TaskType

log = logging.getLogger("contend.expert")

#: Records per task, unless the pipeline says otherwise.
DEFAULT_BATCH = 1000
#: Pending tasks a stage's queue may hold before the stage above it stops claiming.
DEFAULT_LIMIT = 1000
#: The stage above resumes once the queue is back under this share of the limit.
RESUME_AT = 0.9
#: How often an expert reads the downstream queues' backlog, seconds; more often while one
#: of its stages waits, so that it resumes soon after the queue drains.
GATE_EVERY = 0.2
GATE_EVERY_CLOSED = 0.05


@dataclass(frozen=True)
class Pipeline:
    """Stages joined by queues: ``app.pipeline("logs", extract, transform, load)``."""

    app: App
    name: str
    stages: tuple[str, ...]  # task type names, first to last
    batch: int = DEFAULT_BATCH
    limit: int = DEFAULT_LIMIT

    def queue(self, stage: int) -> str:
        return self.app.tasks[self.stages[stage]].queue

    @property
    def queues(self) -> list[str]:
        return [self.queue(n) for n in range(len(self.stages))]

    def specs(
        self, records: Iterable[JSON], *, key: str | None = None, batch: int | None = None
    ) -> list[TaskSpec]:
        """The first stage's tasks for *records*, *batch* (default: the pipeline's) a task.
        With *key*, each task's idempotency key is ``KEY:N``, so feeding the same records
        again adds nothing."""
        size = self.batch if batch is None else check_count(batch, "batch", 100_000)
        out = []
        for n, chunk in enumerate(chunks(list(records), size)):
            out.append(
                self.app.build_spec(
                    self.stages[0], [chunk], key=None if key is None else f"{key}:{n}"
                )
            )
        return out

    async def feed(
        self, records: Iterable[JSON], *, key: str | None = None, batch: int | None = None
    ) -> list[TaskHandle]:
        """Submit *records* to the first stage; see :meth:`specs`."""
        return await self.app.submit_many(self.specs(records, key=key, batch=batch))


def chunks(records: Sequence[JSON], size: int) -> list[list[JSON]]:
    return [list(records[i : i + size]) for i in range(0, len(records), size)]


def check_count(value: object, what: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ConfigError(f"{what} must be a whole number from 1 to {most:,}, got {shown(value)}")
    return value


def build(
    app: App,
    name: str,
    functions: Sequence[Callable[..., Any]],
    *,
    batch: int,
    limit: int,
    options: Mapping[str, Any],
) -> Pipeline:
    """Register each function as a stage (type and queue ``NAME.FUNCTION``) and join them."""
    if name in app.pipelines:
        raise ConfigError(f"pipeline {shown(name)} is defined twice")
    if len(functions) < 2:
        raise ConfigError(f"pipeline {shown(name)} needs at least two stages")
    check_count(batch, "batch", 100_000)
    check_count(limit, "limit", 10_000_000)
    names = []
    for fn in functions:
        if not callable(fn):
            raise ConfigError(
                f"a stage of pipeline {shown(name)} must be a function, got {shown(fn)}"
            )
        stage = f"{name}.{getattr(fn, '__name__', 'stage')}"
        if stage in names:
            raise ConfigError(f"pipeline {shown(name)} has stage {shown(stage)} twice")
        _check_signature(stage, fn)
        names.append(stage)
    TaskSpec.build("check", queue=names[0])  # the stage names make valid queue names
    for fn, stage in zip(functions, names, strict=True):
        app.task(name=stage, queue=stage, **options)(fn)
    for stage, after in itertools.pairwise(names):
        app.tasks[stage] = replace(app.tasks[stage], forward_to=after, forward_batch=batch)
    pipeline = Pipeline(app, name, tuple(names), batch, limit)
    app.pipelines[name] = pipeline
    return pipeline


def _check_signature(stage: str, fn: Callable[..., Any]) -> None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if params and params[0].name == "ctx":
        params = params[1:]
    required = [p for p in params if p.default is inspect.Parameter.empty]
    if len(params) < 1 or len(required) > 1:
        raise ConfigError(
            f"stage {shown(stage)} must take one list of records (besides ctx), got "
            f"({', '.join(p.name for p in params)})"
        )


def forwarded(
    tasks: Mapping[str, TaskType], tt: TaskType, task_id: str, output: object
) -> list[TaskSpec]:
    """The next stage's tasks for what a run of stage *tt* returned (a list of records)."""
    if not isinstance(output, list):
        raise TaskError(
            f"stage {shown(tt.name)} must return a list of records for "
            f"{shown(tt.forward_to)}, got {type(output).__name__}"
        )
    nxt = tasks[str(tt.forward_to)]
    return [
        TaskSpec.build(
            nxt.name,
            [chunk],
            queue=nxt.queue,
            priority=nxt.priority,
            key=f"{task_id}:{n}",
            requirements=nxt.requirements,
            max_attempts=nxt.retry.max_attempts,
            timeout=nxt.timeout,
        )
        for n, chunk in enumerate(chunks(output, tt.forward_batch))
    ]


class Gate:
    """Which of an expert's queues are closed by back-pressure, refreshed from the store."""

    def __init__(
        self, store: Store, pipelines: Iterable[Pipeline], queues: Sequence[str], clock: Clock
    ) -> None:
        self.store = store
        self.clock = clock
        #: upstream queue this expert serves -> (the queue after it, its limit)
        self.watch: dict[str, tuple[str, int]] = {}
        for p in pipelines:
            qs = p.queues
            for up, down in itertools.pairwise(qs):
                if up in queues:
                    self.watch[up] = (down, p.limit)
        #: downstream queue -> tasks this expert sent there since the last read
        self._sent: dict[str, int] = {}
        self._pending: dict[str, int] = {}
        self._limits = {down: limit for down, limit in self.watch.values()}
        self._feeds = {down: up for up, (down, _) in self.watch.items()}
        self.closed: set[str] = set()
        self._read_at = -1e18
        self._lock = asyncio.Lock()

    def note(self, queue: str, tasks: int) -> None:
        """This expert just sent *tasks* to *queue*: between two reads, count them in, so
        that a fast stage closes at once rather than after a read's interval of output."""
        if queue not in self._limits:
            return
        self._sent[queue] = self._sent.get(queue, 0) + tasks
        up = self._feeds[queue]
        if (
            up not in self.closed
            and self._pending.get(queue, 0) + self._sent[queue] > self._limits[queue]
        ):
            self.closed.add(up)

    @property
    def active(self) -> bool:
        return bool(self.watch)

    async def open_queues(self, queues: Sequence[str]) -> list[str]:
        """*queues* less those closed now (read again when the last read is old)."""
        if not self.watch:
            return list(queues)
        every = GATE_EVERY_CLOSED if self.closed else GATE_EVERY
        if self.clock.monotonic() - self._read_at >= every:
            async with self._lock:
                if self.clock.monotonic() - self._read_at >= every:
                    await self._refresh()
        return [q for q in queues if q not in self.closed]

    async def _refresh(self) -> None:
        for up, (down, limit) in self.watch.items():
            self._sent[down] = 0
            pending = self._pending[down] = (await self.store.backlog([down])).pending
            if up in self.closed and pending < limit * RESUME_AT:
                self.closed.discard(up)
                log.info("back-pressure: %s resumes (%s holds %d)", up, down, pending)
            elif up not in self.closed and pending > limit:
                self.closed.add(up)
                log.info("back-pressure: %s waits (%s holds %d > %d)", up, down, pending, limit)
        self._read_at = self.clock.monotonic()


#: The window of a stage's rate, seconds: what ``StoreStats.done_by_queue`` counts.
RATE_WINDOW = 60.0


@dataclass(frozen=True)
class StageStats:
    """One stage as ``contend status`` shows it: its backlog and its rate, read from one
    :meth:`Store.stats` (no store call of its own, so every backend gives it)."""

    pipeline: str
    stage: str  # the stage's task type
    queue: str
    pending: int  # in its queue, due or not
    running: int  # claimed or running
    done_last_minute: int  # succeeded in the last RATE_WINDOW seconds
    failed: int  # failed or dead, ever (until pruned)
    held: bool  # the next stage's queue holds more than the limit: back-pressure

    @property
    def rate(self) -> float:
        """Tasks done a second over the last minute."""
        return self.done_last_minute / RATE_WINDOW

    @property
    def backlog(self) -> int:
        return self.pending + self.running

    def to_json(self) -> dict[str, JSON]:
        return {
            "stage": self.stage,
            "queue": self.queue,
            "pending": self.pending,
            "running": self.running,
            "backlog": self.backlog,
            "done_last_minute": self.done_last_minute,
            "rate_per_s": self.rate,
            "failed": self.failed,
            "held": self.held,
        }


def stage_stats(pipeline: Pipeline, stats: StoreStats) -> list[StageStats]:
    """Each stage of *pipeline*, first to last, from *stats*. ``held`` reads the next queue's
    pending count against the limit: the gate's own test, without its hysteresis."""
    queues = pipeline.queues
    counts = [stats.counts.get(q, {}) for q in queues]
    out = []
    for n, (stage, queue) in enumerate(zip(pipeline.stages, queues, strict=True)):
        c = counts[n]
        nxt = counts[n + 1] if n + 1 < len(queues) else {}
        out.append(
            StageStats(
                pipeline=pipeline.name,
                stage=stage,
                queue=queue,
                pending=c.get(TaskState.PENDING, 0),
                running=c.get(TaskState.CLAIMED, 0) + c.get(TaskState.RUNNING, 0),
                done_last_minute=stats.done_by_queue.get(queue, 0),
                failed=c.get(TaskState.FAILED, 0) + c.get(TaskState.DEAD, 0),
                held=nxt.get(TaskState.PENDING, 0) > pipeline.limit,
            )
        )
    return out
