"""The executor: runs claimed tasks and turns each run into an outcome for the committer.

Async task functions run on the event loop, sync ones in a thread pool of the expert's
concurrency (or, once they have proved short, on the loop too: ``runtime.inline``); both under
the task's timeout on the expert's clock. A run belongs to the session
its task was claimed under: its checkpoints are refused once that session is no longer safe,
and when it is lost the run is stopped and nothing of it is committed. A sync function cannot
be interrupted in its thread: it is told to stop (``ctx.cancelled``) and its result, if it
ever comes, is thrown away. A task type with ``isolation="process"`` runs in a child process
instead (``runtime.isolation``), which is killed when its run must stop.

A run may complete its task in a transaction of its own (``ctx.transaction()``): the run opens
it through the store (``Store.begin``) and commits it with the completion under the run's
fence. Such a run is over as far as the store is concerned: its outcome is not sent to the
committer, and the hooks see ``after_execute`` then ``on_committed`` when the function returns
(or when the run is stopped after the commit), as for a run committed the usual way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contend.domain.retry import RetryPolicy
from contend.domain.task import JSON, Task, TaskState, encode_json
from contend.errors import (
    ConfigError,
    ContendError,
    FencedOut,
    LeaseLost,
    MemoryLimitExceeded,
    PayloadError,
    StoreBusy,
    StoreUnavailable,
    TaskStopped,
)
from contend.runtime.clock import Clock, bounded, wait_event
from contend.runtime.competition import TypeTracker
from contend.runtime.context import TaskContext, _current
from contend.runtime.hooks import Hook, Outcome, task_fields
from contend.runtime.inline import InlinePolicy
from contend.runtime.isolation import ChildFailed, run_in_process
from contend.runtime.pipeline import forwarded
from contend.runtime.session import Session
from contend.runtime.task_type import TaskType
from contend.runtime.threads import ThreadRunner
from contend.store.port import Claimed, Completion, Failure, Store, TaskTransaction

log = logging.getLogger("contend.expert")

T = TypeVar("T")

#: How long a rollback may take before the run gives up on it (its connection is then broken,
#: and the database ends the transaction when it notices), seconds.
ROLLBACK_WITHIN = 5.0
#: How long a task's checkpoint, progress report or read is tried again while the store cannot
#: be reached or is busy, seconds (Run._patiently), within the lease: as long as the SQL
#: stores' own retries (PostgreSQL's retry deadline, SQLite's busy deadline).
PATIENCE = 30.0


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


@dataclass(eq=False, slots=True)
class Run:
    """One execution of a claimed task under one session; the host its context talks to."""

    claimed: Claimed
    session: Session
    store: Store
    expert: str
    ctx: TaskContext = field(init=False)
    task: asyncio.Task[None] | None = None
    finished: bool = False  # an outcome was sent, or the run was stopped
    started: float = 0.0  # the clock's monotonic time when it started
    launched: float = 0.0  # the expert's monotonic clock when the run was launched
    tx: TaskTransaction | None = None  # the task's own transaction, while it is open
    committed: Completion | None = None  # the completion its transaction committed
    committing: bool = False  # its transaction's commit is in flight
    service: float | None = None  # a plain function's own time in its thread, seconds
    _parents: dict[str, JSON] | None = None  # read once, on first use

    async def parents(self) -> dict[str, JSON]:
        """The results of the task's dependencies, by id in ``depends_on`` order: None for
        one that did not succeed (an edge with ``if_failed="run"`` lets the task run
        without it)."""
        if self._parents is None:
            me = await self._under_session(
                "a read", lambda: self.store.get(self.claimed.id), patient=True
            )
            out: dict[str, JSON] = {}
            for pid in me.depends_on:
                parent = await self._under_session("a read", _getter(self.store, pid), patient=True)
                out[pid] = parent.result if parent.state == TaskState.SUCCEEDED else None
            self._parents = out
        return self._parents

    async def checkpoint(self, text: str) -> None:
        c = self.claimed
        if self.tx is not None:
            raise RuntimeError(
                f"task {c.id}: ctx.checkpoint() inside ctx.transaction() (the transaction "
                "completes the task; a checkpoint has no use there)"
            )
        await self._save(
            "a checkpoint", lambda: self.store.checkpoint(self.expert, c.id, c.fence, text)
        )

    async def progress(self, text: str) -> None:
        c = self.claimed
        await self._save(
            "a progress report", lambda: self.store.progress(self.expert, c.id, c.fence, text)
        )

    def must_stop(self) -> str | None:
        if self.session.safe():
            return None
        return f"the lease was lost ({self.session.reason or 'no renewal within the lease'})"

    async def _save(self, what: str, write: Callable[[], Awaitable[None]]) -> None:
        """A fenced write of the running task, under its session."""
        c = self.claimed
        if self.finished or self.committed is not None:
            raise FencedOut(c.id, c.fence, "this run was stopped or has completed the task")
        try:
            await self._patiently(what, write)
        except LeaseLost as exc:
            detail = f"this expert's lease lapsed: {exc}"
            raise FencedOut(c.id, c.fence, detail, reason="expert_lease") from exc

    async def _patiently(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        """``make()`` under the session, tried again with back-off while the store cannot be
        reached or is busy (for up to PATIENCE from the first failure, and only while the lease
        holds): an etcd restart of 0.8 s (2-3 s before it served again) failed the checkpoints
        of the tasks running then, and each task's next attempt waited out its retry back-off
        behind the backlog (recoveries of 13-20 s in the chaos suite). For a task's
        checkpoints, progress and reads: writes of the same value, or reads. A lease lost
        meanwhile raises LeaseLost at once; any other error of the store, that error."""
        session = self.session
        give_up = session.clock.monotonic() + PATIENCE
        pause = 0.05
        while True:
            try:
                return await session.call(what, make)
            except (StoreUnavailable, StoreBusy):
                if self.finished or session.clock.monotonic() + pause > give_up:
                    raise
            await session.clock.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, 1.0)

    # -- the task's own transaction (ctx.transaction()) ----------------------------------
    async def begin(self) -> TaskTransaction:
        c = self.claimed
        if self.committed is not None:
            raise RuntimeError(f"task {c.id} was completed by its transaction already")
        if self.tx is not None:
            raise RuntimeError(f"task {c.id} has a transaction open already (no nesting)")
        if self.finished or self.ctx.cancelled:
            raise FencedOut(c.id, c.fence, "this run was stopped")
        if not self.store.promises.transactions:
            raise ConfigError(
                f"store {self.store.url} gives tasks no transactions of their own "
                "(promises.transactions is false)"
            )

        async def opening() -> TaskTransaction:
            # Kept the moment it opens, even if this run is stopped before it hears of it
            # (the call given up on after it finished): the run's end rolls it back.
            self.tx = await self.store.begin(self.expert, c.id, c.fence)
            return self.tx

        return await self._under_session("opening a transaction", opening)

    async def commit(self, tx: TaskTransaction) -> None:
        """Encode ``tx.result`` and commit it with the transaction, under the run's fence."""
        c = self.claimed
        self.tx = None
        try:
            text = encode_json(tx.result, f"result of task {c.id}")
            if self.finished or not self.session.safe():
                why = "this run was stopped" if self.finished else "the lease is not safe"
                raise FencedOut(c.id, c.fence, why, reason="expert_lease")
        except BaseException:
            await self._rollback(tx)
            raise
        completion = Completion(c.id, c.fence, text)

        async def committing() -> None:
            await tx.commit(completion)
            self.committed = completion  # at once: this run may be stopped meanwhile

        self.committing = True
        try:
            await self.session.call("a transaction's commit", committing)
        except LeaseLost as exc:
            await self._rollback(tx)  # a commit cut short cleaned up after itself; one never
            raise LeaseLost(  # sent must be rolled back
                f"task {c.id}: {exc}; whether its transaction committed is unknown (its "
                "writes and its completion landed together or not at all)"
            ) from exc
        except BaseException:
            if self.committed is None:
                await self._rollback(tx)  # stopped before the commit was sent: roll back
            raise
        finally:
            self.committing = False

    async def rollback(self, tx: TaskTransaction) -> None:
        self.tx = None
        await self._rollback(tx)

    async def _rollback(self, tx: TaskTransaction) -> None:
        try:
            await bounded(self.session.clock, tx.rollback(), ROLLBACK_WITHIN)
        except (TimeoutError, ContendError, OSError) as exc:
            log.warning("task %s: its transaction's rollback failed: %r", self.claimed.id, exc)

    async def pause(self, tries: int) -> None:
        await self.session.clock.sleep(min(0.5, 0.002 * 2**tries) * random.uniform(0.5, 1))

    async def _under_session(
        self, what: str, make: Callable[[], Awaitable[T]], *, patient: bool = False
    ) -> T:
        """``make()`` under the session (sent only while it is safe, bounded by its lease);
        a lease that is lost or runs out meanwhile is this run's FencedOut. *patient*: tried
        again while the store cannot be reached (:meth:`_patiently`)."""
        c = self.claimed
        try:
            if patient:
                return await self._patiently(what, make)
            return await self.session.call(what, make)
        except LeaseLost as exc:
            raise FencedOut(
                c.id, c.fence, f"{what} not answered in time: {exc}", reason="expert_lease"
            ) from exc


def _getter(store: Store, task_id: str) -> Callable[[], Awaitable[Task]]:
    return lambda: store.get(task_id)


class Ended:
    """The host of a context whose run is over: a checkpoint or a transaction it is asked for
    is refused."""

    def __init__(self, claimed: Claimed) -> None:
        self.claimed = claimed

    async def checkpoint(self, text: str) -> None:
        raise FencedOut(self.claimed.id, self.claimed.fence, "the run has ended")

    async def begin(self) -> TaskTransaction:
        raise FencedOut(self.claimed.id, self.claimed.fence, "the run has ended")

    async def commit(self, tx: TaskTransaction) -> None:
        await tx.rollback()
        raise FencedOut(self.claimed.id, self.claimed.fence, "the run has ended")

    async def rollback(self, tx: TaskTransaction) -> None:
        await tx.rollback()

    async def pause(self, tries: int) -> None:
        return None

    async def parents(self) -> dict[str, JSON]:
        raise FencedOut(self.claimed.id, self.claimed.fence, "the run has ended")

    async def progress(self, text: str) -> None:
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
        self.on_free = on_free  # called when a run ends (a slot is free)
        #: called with (queue, tasks) when a pipeline stage's run sent its output on
        self.on_forwarded: Callable[[str, int], None] = lambda queue, tasks: None
        self.runs: dict[str, Run] = {}
        self._ended = asyncio.Event()  # a run ended (or the drain was cut short)
        self._concurrency = concurrency
        self.mean_run: float | None = None  # seconds a run takes, a moving average
        #: the same for each task type (its app's types: a bounded map), so that a burst of
        #: slow ones after short ones is not claimed ahead on the short ones' mean
        self.type_means: dict[str, float] = {}
        self._threads: ThreadRunner | None = None  # started with the first sync function
        self.inline = InlinePolicy()  # which sync functions have proved short enough for the loop

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
        run.started = self.clock.monotonic()
        self.runs[claimed.id] = run
        self.hooks.before_execute(self.name, claimed)
        run.task = asyncio.create_task(self._execute(run), name=f"contend-task-{claimed.id}")
        return run

    # -- a run -----------------------------------------------------------------------------
    async def _execute(self, run: Run) -> None:
        c = run.claimed
        started = run.started
        try:
            tt = self.tasks.get(c.type)
            if tt is None:
                message = f"expert {self.name} has no task type {c.type!r}"
                self._finish(run, build_failure(c, "UnknownTaskType", message, policy=None), None)
                return
            why = run.must_stop()
            if why is not None:
                # Its lease ran out by this host's reckoning before the run began (a task
                # held ahead for a slot, and the process paused or the loop late), and the
                # watchdog has not said so yet: a rival may own the task by now.
                self.abandon(run, why)
                return
            error: BaseException | None = None
            try:
                result = await self._call(tt, run)
                if tt.forward_to is not None:  # a pipeline stage: its output goes on
                    result = await self._forward(tt, run, result)
                outcome: Outcome = Completion(
                    c.id, c.fence, encode_json(result, f"result of task {c.id}")
                )
            except Exception as exc:  # (a stopped run ends with CancelledError, not here)
                outcome, error = self._failure(tt, c, exc), exc
                if isinstance(exc, ChildFailed):
                    error = exc.error or exc
            if run.committed is not None:  # its own transaction completed it
                outcome, error = self._committed(run, outcome, error)
            elif isinstance(error, TaskStopped) and run.must_stop() is not None:
                # it saw its lease gone before the watchdog did: stopped, not failed
                self.abandon(run, run.ctx._why)
                return
            seconds = self.clock.monotonic() - started
            # how long a run holds its slot, for claiming ahead (ClaimLoop.ahead): a plain
            # function's own time in its thread, not its wait for a worker and for the loop,
            # which shrank with the claims it set (sync no-op tasks measured 2.4 ms against
            # 0.9 ms for coroutines, and claimed a third as far ahead, in 4× the transactions)
            sample = seconds if run.service is None else run.service
            mean = self.mean_run
            self.mean_run = sample if mean is None else mean + 0.05 * (sample - mean)
            mean = self.type_means.get(c.type)
            self.type_means[c.type] = sample if mean is None else mean + 0.2 * (sample - mean)
            self.tracker.record(c.type, error is None, seconds)
            self._finish(run, outcome, error, seconds)
        finally:
            if run.tx is not None:  # opened and never ended (the block was not left)
                await run.rollback(run.tx)
            if self.runs.get(c.id) is run:
                del self.runs[c.id]
            # The run and its context point at each other: without this, every task would
            # leave a cycle (run, context, asyncio task, coroutine) for the garbage collector.
            run.ctx._host = Ended(c)
            self._ended.set()
            self.on_free()

    @staticmethod
    def _committed(
        run: Run, outcome: Outcome, error: BaseException | None
    ) -> tuple[Outcome, BaseException | None]:
        """The outcome of a run whose transaction committed: what it committed, whatever the
        task did after it."""
        committed = run.committed
        assert committed is not None
        c = run.claimed
        if error is not None:
            log.warning(
                "task %s raised %r after its transaction committed; it stays succeeded",
                c.id,
                error,
            )
        elif isinstance(outcome, Completion) and outcome.result_json not in (
            "null",
            committed.result_json,
        ):
            log.warning(
                "task %s: what it returned after its transaction committed is ignored; its "
                "result is the transaction's (tx.result)",
                c.id,
            )
        return committed, None

    @staticmethod
    def _failure(tt: TaskType, c: Claimed, exc: Exception) -> Failure:
        """The failure the retry policy makes of what a run raised."""
        if isinstance(exc, TimeoutError):
            message = f"task exceeded its {c.timeout or tt.timeout}s timeout"
            return build_failure(c, "Timeout", message, policy=tt.retry)
        if isinstance(exc, PayloadError):
            return build_failure(c, "PayloadError", str(exc), policy=None)
        if isinstance(exc, MemoryLimitExceeded):  # the same input would need the same memory
            return build_failure(c, "MemoryLimitExceeded", str(exc), policy=None)
        if isinstance(exc, ChildFailed):  # what the task raised in its own process
            error = exc.error or exc
            return build_failure(c, exc.kind, exc.message, policy=tt.retry, error=error, tb=exc.tb)
        tb = traceback.format_exc(limit=20)
        return build_failure(c, type(exc).__name__, str(exc), policy=tt.retry, error=exc, tb=tb)

    async def _forward(self, tt: TaskType, run: Run, output: object) -> JSON:
        """Submit a pipeline stage's output to the next stage (keyed by this task's id and
        place, so a repeated run adds nothing), before the run commits; its result is how
        much it forwarded."""
        specs = forwarded(self.tasks, tt, run.claimed.id, output)
        if specs:
            await run._under_session("a submission", lambda: self.store.submit(specs))
            self.on_forwarded(specs[0].queue, len(specs))
        return {"records": len(output) if isinstance(output, list) else 0, "tasks": len(specs)}

    async def _call(self, tt: TaskType, run: Run) -> Any:
        c, ctx = run.claimed, run.ctx
        args = [ctx, *c.args] if tt.pass_context else list(c.args)
        kwargs: Mapping[str, JSON] = c.kwargs
        if tt.wants_parents:  # a parameter named parents: its dependencies' results
            kwargs = {**c.kwargs, "parents": list((await run.parents()).values())}
        timeout = c.timeout or tt.timeout
        token = _current.set(ctx)
        try:
            if tt.isolation == "process":  # killed, not told, when the run must stop
                child = run_in_process(
                    tt.target,
                    list(c.args),
                    dict(kwargs),
                    ctx if tt.pass_context else None,
                    run.checkpoint,
                    run.progress,
                    memory_limit=tt.memory_limit,
                    task_type=tt.name,
                )
                return await self.clock.wait_for(child, timeout)
            if tt.is_async:
                if timeout is None:  # no wait_for: one coroutine less per task
                    return await tt.fn(*args, **kwargs)
                return await self.clock.wait_for(tt.fn(*args, **kwargs), timeout)
            movable = tt.isolation is None and timeout is None
            if movable and self.inline.on_loop(tt.name):
                return await self._on_loop(tt, run, args, kwargs)
            threads = self._threads
            if threads is None:
                loop = asyncio.get_running_loop()
                threads = self._threads = ThreadRunner(loop, self._concurrency, self.name)
            took: list[float] = []
            fut = threads.run(tt.fn, args, kwargs, ctx, took)
            try:
                result = await (fut if timeout is None else self.clock.wait_for(fut, timeout))
                run.service = took[0] if took else None
                if movable and took:
                    self.inline.ran_in_thread(tt.name, took[0], called_back=ctx._called_back)
                return result
            except TimeoutError:
                ctx._stop("it timed out")  # a thread cannot be interrupted: tell it to stop
                raise
            except asyncio.CancelledError:
                ctx._stop("it was stopped")
                raise
        finally:
            _current.reset(token)

    async def _on_loop(
        self, tt: TaskType, run: Run, args: list[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """Run a sync function that has proved short on the loop itself (contend.runtime.inline).
        The loop is hidden from it, as it would be in a thread (so ``asyncio.run`` inside works);
        what it asked ``checkpoint_sync`` / ``progress_sync`` to write is written after it returns,
        whether it returned or raised."""
        ctx = run.ctx
        deferred: list[Callable[[], Awaitable[None]]] = []
        ctx._deferred = deferred
        loop = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        began = time.perf_counter()
        try:
            result = tt.fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - began
            asyncio.events._set_running_loop(loop)
            ctx._deferred = None
            run.service = took
            self.inline.ran_on_loop(tt.name, took, called_back=ctx._called_back)
            for write in deferred:
                await write()
        return result

    def _finish(
        self, run: Run, outcome: Outcome, error: BaseException | None, seconds: float = 0.0
    ) -> None:
        if run.finished:
            return  # stopped meanwhile: nothing of it may be committed
        run.finished = True
        self.hooks.after_execute(self.name, run.claimed, outcome, seconds, error)
        if outcome is run.committed:
            self.hooks.on_committed(self.name, outcome)  # in its transaction: nothing to send
            return
        self._deliver(outcome, run.session)

    # -- stopping runs ---------------------------------------------------------------------
    def abandon(self, run: Run, reason: str) -> None:
        """Stop *run* at once; nothing of it will be committed."""
        run.ctx._stop(reason)
        was_finished, run.finished = run.finished, True
        if run.task is not None and run.task is not asyncio.current_task():
            run.task.cancel()
        self.runs.pop(run.claimed.id, None)
        if was_finished:
            pass
        elif run.committed is not None:  # completed in its transaction: stopped after it
            seconds = self.clock.monotonic() - run.started
            self.hooks.after_execute(self.name, run.claimed, run.committed, seconds, None)
            self.hooks.on_committed(self.name, run.committed)
        else:
            self.hooks.on_abandoned(self.name, run.claimed, reason)
        self._ended.set()
        self.on_free()

    def abandon_session(self, session: Session, reason: str) -> int:
        """Stop every run of *session*; returns how many."""
        runs = [r for r in self.runs.values() if r.session is session]
        for run in runs:
            self.abandon(run, reason)
        return sum(1 for r in runs if r.committed is None)

    def retain(self, held: Mapping[str, int], sent: float) -> None:
        """Stop the runs whose task the store no longer gives this expert under their fence
        (cancelled, expired, taken over), by a renewal sent at *sent*: a run launched after
        that (its claim answered after it) may not be in the answer yet, and is kept."""
        for task_id, run in list(self.runs.items()):
            if run.launched >= sent:
                continue  # claimed after the renewal was sent: the next one judges it
            if run.committed is not None or run.committing:
                continue  # completed in its transaction (or completing): no longer held
            if held.get(task_id) != run.claimed.fence and not run.finished:
                log.warning(
                    "expert %s: task %s (%s) attempt %d fence %d is no longer ours; stopping it",
                    self.name,
                    task_id,
                    run.claimed.type,
                    run.claimed.attempt,
                    run.claimed.fence,
                    extra=task_fields(self.name, run.claimed),
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
        if self._threads is not None:
            self._threads.close()
