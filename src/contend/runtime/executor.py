"""The executor: runs claimed tasks and turns each run into an outcome for the committer.

Async task functions run on the event loop, sync ones in a thread pool of the expert's
concurrency; both under the task's timeout on the expert's clock. A run belongs to the session
its task was claimed under: its checkpoints are refused once that session is no longer safe,
and when it is lost the run is stopped and nothing of it is committed. A sync function cannot
be interrupted in its thread: it is told to stop (``ctx.cancelled``) and its result, if it
ever comes, is thrown away. A task type with ``isolation="process"`` runs in a child process
instead (``runtime.isolation``), which is killed when its run must stop.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from contend.domain.retry import RetryPolicy
from contend.domain.task import TaskState, encode_json
from contend.errors import FencedOut, LeaseLost, PayloadError, TaskStopped
from contend.runtime.app import TaskType
from contend.runtime.clock import Clock, wait_event
from contend.runtime.competition import TypeTracker
from contend.runtime.context import TaskContext, _current
from contend.runtime.hooks import Hook, Outcome
from contend.runtime.isolation import ChildFailed, run_in_process
from contend.runtime.session import Session
from contend.store.port import Claimed, Completion, Failure, Store

log = logging.getLogger("contend.expert")


def build_failure(
    claimed: Claimed,
    kind: str,
    message: str,
    *,
    policy: RetryPolicy | None,
    error: BaseException | None = None,
    tb: str | None = None,
) -> Failure:
    """The failure of this attempt: its error record, and what follows as *policy* decides
    (``retry_delay``, or the final state). No policy: not retried, final ``failed``. *error*
    None counts as a timeout (always retryable)."""
    body: dict[str, Any] = {"type": kind, "message": message[:4000], "attempt": claimed.attempt}
    if tb:
        body["traceback"] = tb[-8000:]
    text = json.dumps(body)
    if policy is None:
        return Failure(claimed.id, claimed.fence, text, None, TaskState.FAILED)
    d = policy.decide(claimed.attempt, error, max_attempts=claimed.max_attempts)
    return Failure(
        claimed.id, claimed.fence, text, d.delay if d.retry else None, TaskState(d.final_state)
    )


@dataclass(eq=False)
class Run:
    """One execution of a claimed task under one session; the host its context talks to."""

    claimed: Claimed
    session: Session
    store: Store
    expert: str
    ctx: TaskContext = field(init=False)
    task: asyncio.Task[None] | None = None
    finished: bool = False  # an outcome was sent, or the run was stopped
    launched: float = 0.0  # the expert's monotonic clock when the run was launched

    async def checkpoint(self, text: str) -> None:
        c = self.claimed
        if self.finished:
            raise FencedOut(c.id, c.fence, "this run was stopped")
        try:
            await self.session.call(
                "a checkpoint", lambda: self.store.checkpoint(self.expert, c.id, c.fence, text)
            )
        except LeaseLost as exc:
            detail = f"this expert's lease lapsed: {exc}"
            raise FencedOut(c.id, c.fence, detail, reason="expert_lease") from exc

    def must_stop(self) -> str | None:
        if self.session.safe():
            return None
        return f"the lease was lost ({self.session.reason or 'no renewal within the lease'})"


class Ended:
    """The host of a context whose run is over: a checkpoint it is asked for is refused."""

    def __init__(self, claimed: Claimed) -> None:
        self.claimed = claimed

    async def checkpoint(self, text: str) -> None:
        raise FencedOut(self.claimed.id, self.claimed.fence, "the run has ended")

    def must_stop(self) -> str | None:
        return None


class Executor:
    """Runs claimed tasks of *tasks* and hands each outcome to *deliver*."""

    def __init__(
        self,
        store: Store,
        name: str,
        tasks: Mapping[str, TaskType],
        *,
        concurrency: int,
        clock: Clock,
        hooks: Hook,
        tracker: TypeTracker,
        deliver: Callable[[Outcome, Session], None],
        on_free: Callable[[], None],
    ) -> None:
        self.store = store
        self.name = name
        self.tasks = tasks
        self.clock = clock
        self.hooks = hooks
        self.tracker = tracker
        self._deliver = deliver
        self._on_free = on_free
        self.runs: dict[str, Run] = {}
        self._ended = asyncio.Event()  # a run ended (or the drain was cut short)
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix=f"contend-{name}"
        )

    @property
    def load(self) -> int:
        return len(self.runs)

    def launch(self, claimed: Claimed, session: Session) -> Run:
        run = Run(claimed, session, self.store, self.name, launched=self.clock.monotonic())
        run.ctx = TaskContext(
            task_id=claimed.id,
            type=claimed.type,
            queue=claimed.queue,
            fence=claimed.fence,
            attempt=claimed.attempt,
            max_attempts=claimed.max_attempts,
            expert=self.name,
            state=claimed.checkpoint,
            _host=run,
            _loop=asyncio.get_running_loop(),
        )
        self.runs[claimed.id] = run
        self.hooks.before_execute(self.name, claimed)
        run.task = asyncio.create_task(self._execute(run), name=f"contend-task-{claimed.id}")
        return run

    # -- a run -----------------------------------------------------------------------------
    async def _execute(self, run: Run) -> None:
        c = run.claimed
        started = self.clock.monotonic()
        try:
            tt = self.tasks.get(c.type)
            if tt is None:
                message = f"expert {self.name} has no task type {c.type!r}"
                self._finish(run, build_failure(c, "UnknownTaskType", message, policy=None), None)
                return
            outcome, error = await self._outcome(tt, run)
            if isinstance(error, TaskStopped) and run.must_stop() is not None:
                # it saw its lease gone before the watchdog did: stopped, not failed
                self.abandon(run, run.ctx._why)
                return
            seconds = self.clock.monotonic() - started
            self.tracker.record(c.type, isinstance(outcome, Completion), seconds)
            self._finish(run, outcome, error, seconds)
        finally:
            if self.runs.get(c.id) is run:
                del self.runs[c.id]
            # The run and its context point at each other: without this, every task would
            # leave a cycle (run, context, asyncio task, coroutine) for the garbage collector.
            run.ctx._host = Ended(c)
            self._ended.set()
            self._on_free()

    async def _outcome(self, tt: TaskType, run: Run) -> tuple[Outcome, BaseException | None]:
        """Call the task; its result, or the failure the retry policy makes of what it raised.
        A stopped run ends here with CancelledError."""
        c = run.claimed
        try:
            result = await self._call(tt, run)
            return Completion(c.id, c.fence, encode_json(result, f"result of task {c.id}")), None
        except TimeoutError as exc:
            message = f"task exceeded its {c.timeout or tt.timeout}s timeout"
            return build_failure(c, "Timeout", message, policy=tt.retry), exc
        except PayloadError as exc:
            return build_failure(c, "PayloadError", str(exc), policy=None), exc
        except ChildFailed as exc:  # what the task raised in its own process
            error = exc.error or exc
            failure = build_failure(
                c, exc.kind, exc.message, policy=tt.retry, error=error, tb=exc.tb
            )
            return failure, error
        except Exception as exc:
            tb = traceback.format_exc(limit=20)
            failure = build_failure(
                c, type(exc).__name__, str(exc), policy=tt.retry, error=exc, tb=tb
            )
            return failure, exc

    async def _call(self, tt: TaskType, run: Run) -> Any:
        c, ctx = run.claimed, run.ctx
        args = [ctx, *c.args] if tt.pass_context else list(c.args)
        timeout = c.timeout or tt.timeout
        token = _current.set(ctx)
        try:
            if tt.isolation == "process":  # killed, not told, when the run must stop
                child = run_in_process(
                    tt.target,
                    list(c.args),
                    dict(c.kwargs),
                    ctx if tt.pass_context else None,
                    run.checkpoint,
                )
                return await self.clock.wait_for(child, timeout)
            if tt.is_async:
                return await self.clock.wait_for(tt.fn(*args, **c.kwargs), timeout)
            cv = contextvars.copy_context()
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(self._pool, lambda: cv.run(tt.fn, *args, **c.kwargs))
            try:
                return await self.clock.wait_for(fut, timeout)
            except TimeoutError:
                ctx._stop("it timed out")  # a thread cannot be interrupted: tell it to stop
                raise
            except asyncio.CancelledError:
                ctx._stop("it was stopped")
                raise
        finally:
            _current.reset(token)

    def _finish(
        self, run: Run, outcome: Outcome, error: BaseException | None, seconds: float = 0.0
    ) -> None:
        if run.finished:
            return  # stopped meanwhile: nothing of it may be committed
        run.finished = True
        self.hooks.after_execute(self.name, run.claimed, outcome, seconds, error)
        self._deliver(outcome, run.session)

    # -- stopping runs ---------------------------------------------------------------------
    def abandon(self, run: Run, reason: str) -> None:
        """Stop *run* at once; nothing of it will be committed."""
        run.ctx._stop(reason)
        was_finished, run.finished = run.finished, True
        if run.task is not None and run.task is not asyncio.current_task():
            run.task.cancel()
        self.runs.pop(run.claimed.id, None)
        if not was_finished:
            self.hooks.on_abandoned(self.name, run.claimed, reason)
        self._ended.set()
        self._on_free()

    def abandon_session(self, session: Session, reason: str) -> int:
        """Stop every run of *session*; returns how many."""
        runs = [r for r in self.runs.values() if r.session is session]
        for run in runs:
            self.abandon(run, reason)
        return len(runs)

    def retain(self, held: Mapping[str, int], sent: float) -> None:
        """Stop the runs whose task the store no longer gives this expert under their fence
        (cancelled, expired, taken over), by a renewal sent at *sent*: a run launched after
        that (its claim answered after it) may not be in the answer yet, and is kept."""
        for task_id, run in list(self.runs.items()):
            if run.launched >= sent:
                continue
            if held.get(task_id) != run.claimed.fence and not run.finished:
                log.warning(
                    "expert %s: task %s (fence %d) is no longer ours; stopping it",
                    self.name,
                    task_id,
                    run.claimed.fence,
                )
                self.abandon(run, "no longer this expert's")

    def hurry(self) -> None:
        """Wake a drain, to look at its grace again (it may have been cut)."""
        self._ended.set()

    async def drain(self, grace: Callable[[], float]) -> list[Run]:
        """Let running tasks finish within ``grace()`` seconds (read again at each wake-up);
        stop the rest and return them, to be released."""
        if self.runs:
            log.info(
                "expert %s stopping: waiting up to %.0fs for %d task(s)",
                self.name,
                grace(),
                len(self.runs),
            )
        started = self.clock.monotonic()
        while self.runs:
            left = started + grace() - self.clock.monotonic()
            self._ended.clear()
            if left <= 0 or not await wait_event(self.clock, self._ended, left):
                break
        left_runs = list(self.runs.values())
        for run in left_runs:
            self.abandon(run, "the expert stopped before it finished")
        await asyncio.gather(*(r.task for r in left_runs if r.task), return_exceptions=True)
        return left_runs

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
