"""The application: a registry of task types bound to a store URL.

Everything is written once, async. The sync helpers (``submit_sync``, ``handle.wait``) run the
same coroutines on a private event loop in a background thread that ``App.close()`` stops.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from contend.domain.limits import Rate, check_limits
from contend.domain.periodic import DEFAULT_CATCH_UP, DEFAULT_CATCH_UP_WINDOW, Schedule
from contend.domain.retry import RetryPolicy
from contend.domain.task import JSON, IfFailed, Requirements, Task, TaskSpec, TaskState
from contend.errors import ConfigError, TaskError, TaskFailed, UnknownTaskType, shown, shown_url
from contend.runtime import tracing
from contend.runtime.isolation import ISOLATIONS, import_path
from contend.runtime.pipeline import DEFAULT_BATCH, DEFAULT_LIMIT, Pipeline
from contend.runtime.pipeline import build as build_pipeline
from contend.runtime.task_type import TaskType, memory_limit_of, signature_of, wants_context
from contend.store.port import Store

log = logging.getLogger("contend.app")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

StoreFactory = Callable[[str], Store]

#: How a queue's tasks are dispatched (``App.queue``).
QUEUE_MODES = ("compete", "fifo", "central")


def _check_url(url: object) -> None:
    if url is not None and (not isinstance(url, str) or not url.strip()):
        raise ConfigError(f"a store URL must be a non-empty string, got {shown(url)}")


@dataclass(frozen=True)
class StoreChoice:
    """Which store a program uses, and why: ``source`` is ``--store``, ``the app`` or
    ``CONTEND_STORE``; ``ignored`` names a ``CONTEND_STORE`` that was set to another store."""

    url: str
    source: str
    ignored: str | None = None


def choose_store(given: str | None, app_url: str | None) -> StoreChoice:
    """The one rule, the same from Python and from the CLI: the store given on the command line
    (``--store``), else the one the app names in code (``App(url)``), else ``CONTEND_STORE``.
    The environment is a default for an app that names no store; it never overrides one that
    does. An empty ``CONTEND_STORE`` counts as unset."""
    env = os.environ.get("CONTEND_STORE") or None
    for url, source in ((given, "--store"), (app_url, "the app"), (env, "CONTEND_STORE")):
        if url:
            ignored = env if env and source != "CONTEND_STORE" and env != url else None
            return StoreChoice(url, source, ignored)
    raise ConfigError(
        "no store URL: pass App('sqlite:///path.db'), --store URL, or set CONTEND_STORE"
    )


@dataclass(frozen=True)
class Periodic:
    """A periodic task type: its schedule, and whether its function takes the tick."""

    name: str
    schedule: Schedule
    wants_tick: bool = False


class App:
    """``App("sqlite:///tasks.db")``: register task types with ``@app.task``, submit work, and
    run experts with ``contend expert module:app``. Opens nothing until first used."""

    def __init__(
        self,
        store_url: str | None = None,
        *,
        store_factory: StoreFactory | None = None,
    ) -> None:
        _check_url(store_url)
        self._url = store_url
        self._factory = store_factory
        self.tasks: dict[str, TaskType] = {}
        #: The periodic task types (``@app.periodic``) and their schedules.
        self.schedules: dict[str, Periodic] = {}
        #: Queues dispatched otherwise than by competition (``app.queue``): name -> mode.
        self.queue_modes: dict[str, str] = {}
        #: Pipelines (``app.pipeline``) by name.
        self.pipelines: dict[str, Pipeline] = {}
        self._stores: dict[asyncio.AbstractEventLoop, Store] = {}
        # one store opened per loop, however many callers ask for it at once
        self._opening: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._sync_loop: asyncio.AbstractEventLoop | None = None
        self._sync_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._told = False  # warned once that CONTEND_STORE is ignored

    # -- configuration ---------------------------------------------------------------------
    @property
    def store_url(self) -> str:
        """The store this app uses: ``App(url)`` (or ``with_store``, which ``--store`` calls),
        else ``CONTEND_STORE`` (see :func:`choose_store`)."""
        return choose_store(None, self._url).url

    def with_store(self, url: str) -> App:
        """Point this app at another store (used by the CLI's --store); returns self."""
        if self._stores:
            raise ConfigError("cannot change the store of an app that is already connected")
        _check_url(url)
        self._url = url
        return self

    @overload
    def task(self, fn: F, /) -> F: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int | RetryPolicy | None = None,
        timeout: float | None = None,
        requirements: Requirements | Iterable[str] | Mapping[str, Any] | None = None,
        priority: int = 0,
        pass_context: bool | None = None,
        mode: str = "race",
        isolation: str | None = None,
        memory_limit: int | str | None = None,
        concurrency_limit: int | None = None,
        limit_key: str | None = None,
        rate_limit: str | tuple[float, float] | None = None,
        rate_burst: int = 1,
        fair: bool = False,
    ) -> Callable[[F], F]: ...

    def task(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        retries: int | RetryPolicy | None = None,
        timeout: float | None = None,
        requirements: Requirements | Iterable[str] | Mapping[str, Any] | None = None,
        priority: int = 0,
        pass_context: bool | None = None,
        mode: str = "race",
        isolation: str | None = None,
        memory_limit: int | str | None = None,
        concurrency_limit: int | None = None,
        limit_key: str | None = None,
        rate_limit: str | tuple[float, float] | None = None,
        rate_burst: int = 1,
        fair: bool = False,
    ) -> F | Callable[[F], F]:
        """Register a sync or async function as a task type (named after the function).

        A sync function runs in a worker thread; once it has proved short (32 runs in a row
        under 0.25 ms) it runs on the expert's event loop instead, which costs a no-op task
        about a quarter less CPU, until a run takes over 2 ms there. ``isolation="thread"``
        keeps it in threads always: for a function that is usually quick but may block for
        long (the loop would wait for it once). ``isolation="process"`` runs each call in a
        child process of its own, killed when the
        run must stop (lease lost, timeout, cancel); the function must be importable (a
        module-level function, not in ``__main__``) and its args and result JSON. With it,
        ``memory_limit`` (bytes, or text such as ``"512MiB"``) kills a child whose resident
        memory goes over it, and the attempt fails with ``MemoryLimitExceeded`` (not retried);
        the expert carries on (Linux).

        ``concurrency_limit=K`` lets at most K tasks of this type run at once across all
        experts, per *limit_key*: a template formatted with the task's arguments, such as
        ``"tenant:{tenant}"`` (default: the type's name, one limit for the whole type). The
        store keeps it at claim time (``contend.domain.limits``).

        ``rate_limit="100/s"`` (or ``"600/m"``, ``"5/h"``, a pair ``(count, seconds)``) lets the
        tasks of one limit key start at most that often across all experts, evenly spaced,
        with up to ``rate_burst`` back to back. ``fair=True`` shares the claims of its queue
        fairly among its limit keys: one tenant's burst does not hold back another's tasks
        beyond its share of the slots."""

        def register(f: F) -> F:
            type_name = name or f.__name__
            if not callable(f):
                raise ConfigError(f"@app.task needs a function, got {shown(f)}")
            if type_name in self.tasks and self.tasks[type_name].fn is not f:
                raise ConfigError(f"task type {shown(type_name)} is registered twice")
            _check_options(type_name, f, timeout, mode, isolation)
            limit = memory_limit_of(type_name, memory_limit, isolation)
            rate = None if rate_limit is None else Rate.of(rate_limit, rate_burst)
            if concurrency_limit is not None or limit_key is not None or rate or fair:
                check_limits(limit_key or type_name, concurrency_limit, rate, fair)
            # validate queue and priority the same way a submission will
            TaskSpec.build(type_name, queue=queue, priority=priority)
            self.tasks[type_name] = TaskType(
                name=type_name,
                fn=f,
                queue=queue,
                retry=RetryPolicy.of(retries),
                timeout=timeout,
                requirements=Requirements.of(requirements),
                priority=priority,
                pass_context=wants_context(f) if pass_context is None else pass_context,
                mode=mode,
                isolation=isolation,
                memory_limit=limit,
                signature=signature_of(f),
                concurrency_limit=concurrency_limit,
                limit_key=limit_key,
                rate_limit=rate,
                fair=fair,
            )
            return f

        if fn is not None:
            return register(fn)
        return register

    def queue(self, name: str, *, mode: str = "compete") -> None:
        """How the tasks of queue *name* are dispatched: ``"compete"`` (the default: experts
        race or auction for them by fitness), ``"fifo"`` (plain first come, first served:
        any expert that can run one claims it at once, with no race delay and no auction) or
        ``"central"`` (one leader, elected through a store lease among the experts that serve
        the queue, assigns each task to a live expert by load and fitness; only that expert
        may claim it, and it does at once; ``contend.domain.dispatch``). Central queues need a
        store that promises them (``Store.promises.central_dispatch``)."""
        TaskSpec.build("queue-check", queue=name)  # the queue's name, checked as at submit
        if mode not in QUEUE_MODES:
            raise ConfigError(
                f"mode of queue {shown(name)} must be one of {', '.join(QUEUE_MODES)}, "
                f"got {shown(mode)}"
            )
        if mode == "compete":
            self.queue_modes.pop(name, None)
        else:
            self.queue_modes[name] = mode

    def pipeline(
        self,
        name: str,
        *stages: Callable[..., Any],
        batch: int = DEFAULT_BATCH,
        limit: int = DEFAULT_LIMIT,
        **options: Any,
    ) -> Pipeline:
        """Join *stages* (functions, first to last) into a pipeline: each becomes task type and
        queue ``NAME.FUNCTION``, takes a list of records and returns the list for the next
        stage, which the expert submits, *batch* records a task, before it commits the run
        (the last stage's return value is its result). A stage stops claiming while the queue
        after it holds more than *limit* pending tasks. Feed it with ``await
        pipeline.feed(records)``. Other *options* are those of :meth:`task`, for every stage.
        See ``contend.runtime.pipeline``."""
        return build_pipeline(self, name, stages, batch=batch, limit=limit, options=options)

    def periodic(
        self,
        *,
        every: float | None = None,
        cron: str | None = None,
        tz: str = "UTC",
        catch_up: str = DEFAULT_CATCH_UP,
        catch_up_window: float = DEFAULT_CATCH_UP_WINDOW,
        **options: Any,
    ) -> Callable[[F], F]:
        """Register a task type that runs on a schedule: ``every=SECONDS`` (aligned to the
        epoch, so ``every=60`` ticks at each whole minute) or ``cron="*/5 * * * *"`` (in *tz*;
        needs the ``cron`` extra). Each tick runs once across all experts and hosts: every
        expert whose app has the type submits the tick under the tick's idempotency key, and
        the store keeps one. *catch_up* says what runs of the ticks missed while no expert was
        up (within *catch_up_window* seconds): ``"latest"`` (the default) the most recent one,
        ``"all"`` each of them, ``"skip"`` none. A parameter named ``tick`` receives the tick's
        time (ISO 8601, UTC). Other *options* are those of :meth:`task`."""
        schedule = Schedule.build(
            every=every, cron=cron, tz=tz, catch_up=catch_up, catch_up_window=catch_up_window
        )

        def register(f: F) -> F:
            self.task(**options)(f)
            tt = self.task_type(f)
            wants_tick = tt.signature is not None and "tick" in tt.signature.parameters
            try:
                tt.check_arguments([], {"tick": "x"} if wants_tick else {})
            except TaskError as exc:
                del self.tasks[tt.name]
                raise ConfigError(
                    f"periodic task {shown(tt.name)} must take no arguments but ctx and tick"
                    f" ({exc})"
                ) from None
            self.schedules[tt.name] = Periodic(tt.name, schedule, wants_tick)
            return f

        return register

    def task_type(self, name: str | Callable[..., Any]) -> TaskType:
        if callable(name):
            for tt in self.tasks.values():
                if tt.fn is name:
                    return tt
            name = getattr(name, "__name__", repr(name))
        if not isinstance(name, str) or name not in self.tasks:
            raise UnknownTaskType(str(name), list(self.tasks))
        return self.tasks[name]

    @property
    def queues(self) -> list[str]:
        return sorted({t.queue for t in self.tasks.values()}) or ["default"]

    # -- store -----------------------------------------------------------------------------
    async def store(self) -> Store:
        """The store for the running event loop, opened on first use (once: callers that
        ask while it opens wait for that store, rather than each opening one of their own that
        nobody would close)."""
        loop = asyncio.get_running_loop()
        store = self._stores.get(loop)
        if store is not None:
            return store
        async with self._opening.setdefault(loop, asyncio.Lock()):
            store = self._stores.get(loop)
            if store is None:
                self._warn_if_env_ignored()
                if self._factory is not None:
                    store = self._factory(self.store_url)
                else:
                    from contend.store.registry import make_store

                    store = make_store(self.store_url)
                await store.open()
                self._stores[loop] = store
        return store

    def _warn_if_env_ignored(self) -> None:
        choice = choose_store(None, self._url)
        if choice.ignored is not None and not self._told:
            self._told = True
            log.warning(
                "CONTEND_STORE (%s) is ignored: %s names the store %s",
                shown_url(choice.ignored),
                choice.source,
                shown_url(choice.url),
            )

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        self._opening.pop(loop, None)
        store = self._stores.pop(loop, None)
        if store is not None:
            await store.close()

    def close(self) -> None:
        """Close the sync helpers' loop and store."""
        with self._lock:
            loop, thread = self._sync_loop, self._sync_thread
            self._sync_loop = self._sync_thread = None
        if loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run *coro* on the app's private loop; for callers that are not async."""
        with self._lock:
            if self._sync_loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="contend-sync", daemon=True)
                thread.start()
                self._sync_loop, self._sync_thread = loop, thread
            loop = self._sync_loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- submission ------------------------------------------------------------------------
    def build_spec(
        self,
        task: str | Callable[..., Any],
        args: Sequence[JSON] = (),
        kwargs: Mapping[str, JSON] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        key: str | None = None,
        delay: float = 0.0,
        requirements: Requirements | Iterable[str] | Mapping[str, Any] | None = None,
        timeout: float | None = None,
        depends_on: Iterable[str | TaskHandle | After] = (),
        trace: Mapping[str, str] | None = None,
        limit_key: str | None = None,
    ) -> TaskSpec:
        """A validated submission of *task*. *depends_on*: task ids or handles (the task dies
        if one does not succeed), or :class:`After` items that choose otherwise per edge."""
        tt = self.task_type(task)
        if limit_key is not None and not tt.limited:
            raise TaskError(
                f"task type {shown(tt.name)} has no concurrency_limit, rate_limit or fair "
                "share, so a limit key means nothing for it"
            )
        lkey = limit_key if limit_key is not None else tt.limit_key_of(args, kwargs or {})
        edges = [d if isinstance(d, After) else After(d) for d in depends_on]
        spec = TaskSpec.build(
            tt.name,
            args,
            kwargs,
            queue=tt.queue if queue is None else queue,
            priority=tt.priority if priority is None else priority,
            key=key,
            requirements=tt.requirements if requirements is None else requirements,
            delay=delay,
            max_attempts=tt.retry.max_attempts,
            timeout=tt.timeout if timeout is None else timeout,
            depends_on=[e.id for e in edges],
            if_failed=[e.if_failed for e in edges],
            trace=trace,
            central=self.queue_modes.get(tt.queue if queue is None else queue) == "central",
            limit_key=lkey,
            concurrency_limit=tt.concurrency_limit,
            rate_limit=tt.rate_limit,
            fair=tt.fair,
        )
        tt.check_arguments(args, kwargs or {})  # once build() found them a JSON list and object
        return spec

    async def submit(
        self,
        task: str | Callable[..., Any],
        args: Sequence[JSON] = (),
        kwargs: Mapping[str, JSON] | None = None,
        **options: Any,
    ) -> TaskHandle:
        """Submit one task; options: queue, priority, key, delay, requirements, timeout,
        depends_on (ids, handles or :class:`After` items). Returns a handle whose ``result()`` can be awaited."""
        name = self.task_type(task).name
        with tracing.submit_span(name) as (span, carrier):
            spec = self.build_spec(task, args, kwargs, **options, trace=carrier)
            store = await self.store()
            check_central(store, [spec])
            (submitted,) = await store.submit([spec])
            if span is not None:
                span.set_attribute("contend.task.id", submitted.id)
        return TaskHandle(self, submitted.id, created=submitted.created)

    async def submit_many(self, specs: Sequence[TaskSpec]) -> list[TaskHandle]:
        """Submit many prepared specs (see :meth:`build_spec`). Up to the store's
        ``promises.atomic_submit`` tasks they are written all or none; a larger batch may be
        written in parts, and submitting the same specs again completes it (give the specs
        idempotency keys to make that hold across processes, as ``contend submit --batch``
        does)."""
        for spec in specs:
            self.task_type(spec.type)
        store = await self.store()
        check_central(store, specs)
        done = await store.submit(list(specs))
        return [TaskHandle(self, s.id, created=s.created) for s in done]

    def submit_sync(
        self,
        task: str | Callable[..., Any],
        args: Sequence[JSON] = (),
        kwargs: Mapping[str, JSON] | None = None,
        **options: Any,
    ) -> TaskHandle:
        return self.run_sync(self.submit(task, args, kwargs, **options))

    def handle(self, task_id: str) -> TaskHandle:
        return TaskHandle(self, task_id)


def check_central(store: Store, specs: Sequence[TaskSpec]) -> None:
    """Refuse, before anything is written, tasks of a central queue for a store that does not
    promise central dispatch: no expert could ever claim them."""
    if store.promises.central_dispatch:
        return
    for spec in specs:
        if spec.central:
            raise ConfigError(
                f"queue {shown(spec.queue)} is central, and the store {shown_url(store.url)} "
                "does not dispatch central queues yet; use SQLite, etcd or the memory store, or "
                "make the queue 'compete' or 'fifo'"
            )


@dataclass(frozen=True, slots=True)
class After:
    """One dependency of a task and what it does to the task if it does not succeed (fails,
    dies or is cancelled): ``depends_on=[After(parent, if_failed="run")]``.

    * ``"fail"`` (the default, as a bare id or handle): the task dies, its error naming it;
    * ``"cancel"``: the task is cancelled, its history saying why;
    * ``"run"``: the edge counts as done; the task runs once its other dependencies are, and
      that parent's place in its ``parents`` holds None.
    """

    task: str | TaskHandle
    if_failed: str = IfFailed.FAIL

    def __post_init__(self) -> None:
        if self.if_failed not in _CHOICES:
            raise TaskError(
                f"if_failed must be one of {', '.join(_CHOICES)}, got {shown(self.if_failed)}"
            )

    @property
    def id(self) -> str:
        return self.task.id if isinstance(self.task, TaskHandle) else self.task


_CHOICES = tuple(str(c) for c in IfFailed)


class TaskHandle:
    """A submitted task: ``await handle.result()`` or, from sync code, ``handle.wait()``."""

    def __init__(self, app: App, task_id: str, *, created: bool = True) -> None:
        self.app = app
        self.id = task_id
        self.created = created

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id}>"

    async def get(self) -> Task:
        return await (await self.app.store()).get(self.id)

    async def progress(self) -> JSON:
        """The task's last reported progress (``{"done", "total", "note"}``), or None."""
        return (await self.get()).progress

    async def result(
        self, timeout: float | None = None, *, on_progress: Callable[[JSON], None] | None = None
    ) -> JSON:
        """Wait until the task ends; return its result or raise TaskFailed. *on_progress* is
        called with each new progress the task reports (``ctx.progress``) while it runs."""
        store = await self.app.store()

        async def wait() -> Task:
            seen: JSON = None
            while True:
                task = await store.get(self.id)
                if on_progress is not None and task.progress is not None and task.progress != seen:
                    seen = task.progress
                    on_progress(seen)
                if task.state.terminal:
                    return task
                await store.wait_for_change(0.5)

        try:
            task = await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"task {self.id} did not finish within {timeout}s") from None
        if task.state != TaskState.SUCCEEDED:
            raise TaskFailed(self.id, task.state, task.error)
        return task.result

    def wait(
        self, timeout: float | None = None, *, on_progress: Callable[[JSON], None] | None = None
    ) -> JSON:
        return self.app.run_sync(self.result(timeout, on_progress=on_progress))

    def __await__(self) -> Any:
        return self.result().__await__()


def _check_options(
    type_name: str, f: Callable[..., Any], timeout: object, mode: str, isolation: str | None
) -> None:
    """Refuse a task type's bad options, by name, before anything is registered."""
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise ConfigError(f"timeout of {shown(type_name)} must be positive, got {shown(timeout)}")
    if mode not in ("race", "auction", "auto"):
        raise ConfigError(f"mode of {shown(type_name)} must be 'race', 'auction' or 'auto'")
    if isolation not in ISOLATIONS:
        raise ConfigError(
            f"isolation of {shown(type_name)} must be None, 'thread' or 'process', "
            f"got {shown(isolation)}"
        )
    if isolation == "thread" and inspect.iscoroutinefunction(f):
        raise ConfigError(
            f"isolation='thread' of {shown(type_name)} is for plain functions; "
            "an async function runs on the event loop"
        )
    if isolation == "process":
        try:
            import_path(f)
        except ValueError as exc:
            raise ConfigError(f"task type {shown(type_name)}: {exc}") from None
