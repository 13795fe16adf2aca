"""What a running task sees of itself: ``ctx.fence``, ``ctx.attempt``, ``ctx.state``, checkpoints,
and whether it must stop (``ctx.cancelled``, ``ctx.check()``)."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Protocol

from contend.domain.task import JSON, encode_json
from contend.errors import TaskStopped

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

    def must_stop(self) -> str | None:
        """Why the run must stop now though nobody has told it yet (its lease ran out by this
        host's clock: the process was paused past it), or None."""


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

    def checkpoint_sync(self, state: JSON) -> None:
        """The same as :meth:`checkpoint`, for sync task functions running in a worker thread."""
        if self._loop is None:
            raise RuntimeError("this context is not attached to an event loop")
        future = asyncio.run_coroutine_threadsafe(self.checkpoint(state), self._loop)
        future.result()
