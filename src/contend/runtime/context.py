"""What a running task sees of itself: ``ctx.fence``, ``ctx.attempt``, ``ctx.state``, checkpoints,
progress, whether it must stop (``ctx.cancelled``, ``ctx.check()``), and its own transaction on
the store's database (``ctx.transaction()``, ``ctx.transact()``), in which its effects and its
completion commit together."""

from __future__ import annotations

import asyncio
import builtins
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, overload

from contend.domain.task import JSON, check_progress, encode_json
from contend.errors import TaskStopped, TransactionConflict
from contend.store.port import TaskTransaction

X = TypeVar("X")
T = TypeVar("T")

#: How many times ``ctx.transact()`` runs a transaction that met a conflict, by default.
TRANSACT_TRIES = 10

_current: contextvars.ContextVar[TaskContext] = contextvars.ContextVar("contend_task")


def current() -> TaskContext:
    """The context of the task running in this coroutine or worker thread."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("contend.current() called outside a running task") from None


class TaskHost(Protocol):
    """What a context needs from the runtime running its task (the executor's run)."""

    async def checkpoint(self, text: str) -> None:
        """Save the encoded state under the run's fence; raises FencedOut when the run no
        longer owns the task."""

    async def begin(self) -> TaskTransaction:
        """Open the task's own transaction under the run's fence (``ctx.transaction()``)."""

    async def commit(self, tx: TaskTransaction) -> None:
        """Commit *tx* with the task's completion (``tx.result``) under the run's fence."""

    async def rollback(self, tx: TaskTransaction) -> None:
        """Roll *tx* back; never raises."""

    async def pause(self, tries: int) -> None:
        """Wait a little before trying a transaction again after *tries* conflicts."""

    async def progress(self, text: str) -> None:
        """Save the encoded progress under the run's fence; raises FencedOut as checkpoint."""

    async def parents(self) -> dict[str, JSON]:
        """The results of the task's dependencies, by id in ``depends_on`` order."""

    def must_stop(self) -> str | None:
        """Why the run must stop now though nobody has told it yet (its lease ran out by this
        host's clock: the process was paused past it), or None."""


class TransactionBlock(Generic[X]):
    """``async with ctx.transaction() as tx``: opens the task's transaction, commits it with
    the task's completion when the block ends, rolls it back when the block raises."""

    def __init__(self, ctx: TaskContext, kind: type[X] | None) -> None:
        self._ctx = ctx
        self._kind = kind
        self._tx: TaskTransaction | None = None

    def _host(self) -> TaskHost:
        host = self._ctx._host
        if host is None:
            raise RuntimeError("this context is not attached to an expert")
        return host

    async def __aenter__(self) -> X:
        host = self._host()
        tx = await host.begin()
        if self._kind is not None and not isinstance(tx, self._kind):
            await host.rollback(tx)
            raise TypeError(
                f"ctx.transaction({self._kind.__name__}): this task's store gives a "
                f"{type(tx).__name__}"
            )
        self._tx = tx
        return tx  # type: ignore[return-value]  # X is the kind asked for, or Any

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        tx, self._tx = self._tx, None
        if tx is None:
            return False
        if kind is None:
            await self._host().commit(tx)
        else:
            await self._host().rollback(tx)
        return False

    def __enter__(self) -> X:
        raise TypeError(
            "ctx.transaction() is async-only: write the task as `async def` and use "
            "`async with ctx.transaction() as tx:`"
        )

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass
class TaskContext:
    """Passed to a task function that asks for it (a first parameter named ``ctx``, or
    ``pass_context=True``), and available anywhere in the task through ``contend.current()``.

    ``fence`` grows by one every time the task is claimed: hand it to external systems that
    accept fencing tokens so that a stale run cannot overwrite a newer one there either.
    """

    task_id: str
    type: str
    queue: str
    fence: int
    attempt: int
    max_attempts: int
    expert: str
    state: JSON = None  # the last checkpoint, as the previous owner saved it
    _host: TaskHost | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    _why: str = field(default="", repr=False)
    #: the sync helpers were called (the function waits on the loop: never run it there)
    _called_back: bool = field(default=False, repr=False)
    #: while a sync function runs on the loop itself: its helpers' writes, made after it returns
    _deferred: list[Callable[[], Awaitable[None]]] | None = field(default=None, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once this run must stop: the task was cancelled, timed out, taken over or its
        expert lost the lease. Async tasks are cancelled as well; sync tasks, which cannot be
        interrupted in their thread, should check it (or call :meth:`check`) between steps.
        Nothing a stopped run returns is committed.

        It reads the lease deadline itself: a process paused past its lease (SIGSTOP, a frozen
        VM) sees True at once when it resumes, before the runtime's watchdog gets the loop."""
        if not self._cancelled and self._host is not None:
            why = self._host.must_stop()
            if why is not None:
                self._stop(why)
        return self._cancelled

    async def parents(self) -> dict[str, JSON]:
        """The results of this task's dependencies (``depends_on``), by task id, in the order
        they were given: a join task of a fan-out reads what each branch returned; None for a
        dependency that did not succeed (its edge's ``if_failed="run"`` let the task run).
        Read from the store once per run. (A parameter named ``parents`` gets the same as a list.)"""
        host = self._host
        if host is None:
            raise RuntimeError("this context is not attached to an expert")
        return await host.parents()

    def check(self) -> None:
        """Raise :class:`~contend.errors.TaskStopped` if this run must stop; else do nothing.
        Cheap: call it between the steps of a long sync task, and before every side effect
        outside the store."""
        if self.cancelled:
            raise TaskStopped(f"task {self.task_id} (fence {self.fence}) must stop: {self._why}")

    def _stop(self, why: str) -> None:
        """The runtime's side: this run must stop, for *why*. The first reason stays."""
        if not self._cancelled:
            self._cancelled, self._why = True, why

    async def checkpoint(self, state: JSON) -> None:
        """Save *state* (JSON) under this run's fence; the next owner starts from it.
        Raises :class:`~contend.errors.FencedOut` when this run no longer owns the task."""
        text = encode_json(state, f"checkpoint of task {self.task_id}")
        if self._host is None:
            raise RuntimeError("this context is not attached to an expert")
        await self._host.checkpoint(text)
        self.state = state

    @overload
    def transaction(self) -> TransactionBlock[Any]: ...

    @overload
    def transaction(self, kind: builtins.type[X]) -> TransactionBlock[X]: ...

    def transaction(self, kind: builtins.type[X] | None = None) -> TransactionBlock[Any]:
        """``async with ctx.transaction() as tx:`` — a transaction of this task's own on the
        store's database, in which the task's completion is written too, under its fence:
        the task's writes in the block and its completion commit together, or neither does.

        What ``tx`` is depends on the store: ``tx.connection`` (a psycopg ``AsyncConnection``
        or an ``sqlite3.Connection``) for PostgreSQL and SQLite; ``get``/``put``/``delete`` and
        compares for etcd and the memory store. Set ``tx.result`` to the task's result (JSON;
        None by default). When the block ends the task **is completed**: the expert commits
        nothing more for it, and what the function returns afterwards is ignored. A block that
        raises is rolled back and the error takes the usual way (retry policy). A run that no
        longer owns the task gets :class:`~contend.errors.FencedOut`, its writes rolled back;
        a conflict (etcd compare, PostgreSQL serialization failure) gets
        :class:`~contend.errors.TransactionConflict`: use :meth:`transact` to run it again.

        *kind* (``PostgresTransaction``, ``SQLiteTransaction``, ``EtcdTransaction``,
        ``MemoryTransaction``) types ``tx`` for a type checker and refuses another store.
        Async tasks only; one transaction per run, no checkpoint inside it."""
        return TransactionBlock(self, kind)

    async def transact(
        self,
        body: Callable[[Any], Awaitable[T]],
        *,
        tries: int = TRANSACT_TRIES,
        retry_on: tuple[builtins.type[BaseException], ...] = (TransactionConflict,),
    ) -> T:
        """Run ``await body(tx)`` in :meth:`transaction`, again (after a short pause) while it
        ends in one of *retry_on* — a conflict, by default — up to *tries* times. What *body*
        returns becomes the task's result (when not None; else ``tx.result`` as the body left
        it) and is returned."""
        if tries < 1:
            raise ValueError(f"tries must be at least 1, got {tries}")
        for n in range(1, tries + 1):
            try:
                async with self.transaction() as tx:
                    value = await body(tx)
                    if value is not None:
                        tx.result = value
                return value
            except retry_on:
                if n == tries:
                    raise
                if self._host is not None:
                    await self._host.pause(n)
        raise AssertionError("unreachable")

    async def progress(
        self, done: float, total: float | None = None, note: str | None = None
    ) -> None:
        """Report how far this run is (``done`` of ``total``, with an optional ``note``):
        saved under this run's fence, shown by ``contend tasks show``, the dashboard and a
        caller waiting on ``handle.result(on_progress=…)``. Each call is one store write: call
        it per step, not per item. Raises :class:`~contend.errors.FencedOut` when this run no
        longer owns the task, and TaskError for values out of shape."""
        text = encode_json(check_progress(done, total, note), f"progress of task {self.task_id}")
        if self._host is None:
            raise RuntimeError("this context is not attached to an expert")
        await self._host.progress(text)

    def progress_sync(
        self, done: float, total: float | None = None, note: str | None = None
    ) -> None:
        """The same as :meth:`progress`, for sync task functions running in a worker thread."""
        if self._loop is None:
            raise RuntimeError("this context is not attached to an event loop")
        self._called_back = True
        if self._deferred is not None:  # on the loop itself: written once the function returns
            self._deferred.append(lambda: self.progress(done, total, note))
            return
        asyncio.run_coroutine_threadsafe(self.progress(done, total, note), self._loop).result()

    def checkpoint_sync(self, state: JSON) -> None:
        """The same as :meth:`checkpoint`, for sync task functions running in a worker thread."""
        if self._loop is None:
            raise RuntimeError("this context is not attached to an event loop")
        self._called_back = True
        if self._deferred is not None:  # on the loop itself: written once the function returns
            self._deferred.append(lambda: self.checkpoint(state))
            return
        future = asyncio.run_coroutine_threadsafe(self.checkpoint(state), self._loop)
        future.result()
