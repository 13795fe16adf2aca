"""What a running task sees of itself: ``ctx.fence``, ``ctx.attempt``, ``ctx.state``, checkpoints."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Protocol

from contend.domain.task import JSON, encode_json

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

    @property
    def cancelled(self) -> bool:
        """True once this run must stop: the task was cancelled, timed out or its lease was
        lost. Sync tasks, which cannot be interrupted, should check it between steps."""
        return self._cancelled

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
