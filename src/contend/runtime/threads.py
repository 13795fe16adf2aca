"""Plain (sync) task functions in worker threads, with work and results handed over in batches.

``loop.run_in_executor`` costs about as much as the rest of a short task's life: each call
takes the pool's lock, wakes a worker, and wakes the event loop again through its self-pipe to
set the result. Here the jobs go through one :class:`queue.SimpleQueue` (a C queue, no
Python-level lock), and the results come back through a deque that the loop empties in one
callback: a worker wakes the loop only when no wake-up is pending already, so a burst of short
tasks costs one wake-up per batch, not one per task.

A thread cannot be interrupted. A run the expert stops (timeout, lost lease) has its future
cancelled; the function goes on until it returns, and what it returns is dropped. Workers are
daemon threads, started as jobs need them up to *workers*, so a function that never returns
does not hold the expert's process at exit. The function runs with the task's context as
``contend.current()``; other context variables of the event loop do not reach it.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from contend.runtime.context import TaskContext, _current

#: A job: (its future, the function, args, kwargs, the task's context, where to put how long
#: the function ran, or None); None stops a worker.
_Job = tuple[
    "asyncio.Future[Any]",
    Callable[..., Any],
    Sequence[Any],
    Mapping[str, Any],
    TaskContext,
    "list[float] | None",
]


class ThreadRunner:
    """Runs sync functions on up to *workers* daemon threads; ``run`` returns a future."""

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int, name: str) -> None:
        self._loop = loop
        self._max = workers
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._done: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]]
        self._done = collections.deque()
        self._lock = threading.Lock()
        self._wake_pending = False  # a _deliver callback is scheduled and has not run yet
        self._threads: list[threading.Thread] = []
        self._idle = 0  # workers waiting for a job
        self._closed = False

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        ctx: TaskContext,
        took: list[float] | None = None,
    ) -> asyncio.Future[Any]:
        """Queue ``fn(*args, **kwargs)``; the future holds what it returns or raises. *took*
        gets how long the function itself ran, seconds (its time in the thread, without the
        wait for a worker or for the loop to hear of the result)."""
        if self._closed:
            raise RuntimeError("the thread runner is closed")
        fut = self._loop.create_future()
        self._jobs.put((fut, fn, args, kwargs, ctx, took))
        if self._idle == 0 and len(self._threads) < self._max:
            self._start_worker()
        return fut

    def _start_worker(self) -> None:
        n = len(self._threads)
        thread = threading.Thread(target=self._work, name=f"contend-{self._name}-{n}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        jobs, done, lock = self._jobs, self._done, self._lock
        while True:
            with lock:
                self._idle += 1
            job = jobs.get()
            with lock:
                self._idle -= 1
            if job is None:
                return
            fut, fn, args, kwargs, ctx, took = job
            if fut.cancelled():  # stopped before it started: do not run it
                continue
            token = _current.set(ctx)
            began = time.perf_counter()
            try:
                item: tuple[asyncio.Future[Any], Any, BaseException | None]
                item = (fut, fn(*args, **kwargs), None)
            except BaseException as exc:  # handed to the run, which decides what it means
                item = (fut, None, exc)
            finally:
                _current.reset(token)
                if took is not None:
                    took.append(time.perf_counter() - began)
            done.append(item)
            with lock:
                wake, self._wake_pending = not self._wake_pending, True
            if wake:
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody waits for the result
                    return

    def _deliver(self) -> None:
        """On the loop: set the results that came back since the last call."""
        with self._lock:
            self._wake_pending = False
        done = self._done
        while done:
            fut, result, exc = done.popleft()
            if fut.cancelled():
                continue  # the run was stopped: what the function returned is dropped
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)

    def close(self) -> None:
        """Stop the workers once they finish what they run; queued jobs are cancelled."""
        self._closed = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)
