"""The expert: a worker that contends for tasks, runs them under a lease and commits with its fence.

Per slot it moves ``IDLE → CLAIMING → EXECUTING → IDLE`` (seed 002). Four loops share one
event loop:

* the **claim loop** waits for work (a store push or a cheap change check), scores what it
  could run, waits its race delay and claims a batch atomically;
* the **heartbeat** renews the session — one call keeps every held task's lease alive — and
  learns which tasks the store still considers its own; anything else is stopped at once. When
  renewal fails for longer than the lease, the expert stops every task and commits nothing;
* **housekeeping**, after each renewal but apart from it, expires lapsed leases, ages pending
  tasks and refreshes the view of rivals (their load, records and tiers);
* the **committer** groups finished tasks into one fenced ``complete``/``fail`` call.

Competition policy (fitness, race delays, tiers) lives in ``runtime.competition``; prefetching,
work stealing and auctions are in the claim loop's helpers below.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import random
import socket
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contend.domain.scoring import TaskView
from contend.domain.task import LOW_LANE_SHARE, TaskState, encode_json
from contend.errors import (
    ContendError,
    ExpertConflict,
    FencedOut,
    LeaseLost,
    PayloadError,
)
from contend.runtime.app import App, TaskType
from contend.runtime.competition import Competition
from contend.runtime.config import ExpertConfig
from contend.runtime.context import TaskContext, _current
from contend.store.port import (
    Auction,
    Claimed,
    Completion,
    ExpertInfo,
    Failure,
    Heartbeat,
    Store,
)

log = logging.getLogger("contend.expert")


class SlotState(StrEnum):
    IDLE = "idle"
    CLAIMING = "claiming"
    EXECUTING = "executing"


@dataclass
class _Run:
    claimed: Claimed
    ctx: TaskContext
    task: asyncio.Task[None] | None = None
    outcome_sent: bool = False


@dataclass
class ExpertStats:
    claim_attempts: int = 0
    claims_won: int = 0
    tasks_done: int = 0
    tasks_failed: int = 0
    fenced_out: int = 0
    leases_lost: int = 0
    heartbeats: int = 0
    stolen: int = 0  # tasks this expert took from others
    stolen_from_me: int = 0  # prefetched tasks others took before this expert started them


class Expert:
    """Runs task types of *app* from its store until stopped."""

    def __init__(self, app: App, config: ExpertConfig | None = None, **options: Any) -> None:
        self.app = app
        self.config = config or ExpertConfig(**options)
        self.config.validate()
        self.name = self.config.name or f"{socket.gethostname()}-{os.getpid()}"
        self.queues = list(self.config.queues or app.queues)
        self.stats = ExpertStats()
        self._store: Store | None = None
        self._session: str | None = None
        self._runs: dict[str, _Run] = {}
        self._outbox: list[Completion | Failure] = []
        self._outbox_ready = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._stopping = asyncio.Event()
        self._claiming_stopped = asyncio.Event()
        self._last_renewal = 0.0  # time.monotonic() of the last successful renewal
        self.competition = Competition(
            self.name,
            self.config.capabilities,
            self.config.concurrency,
            self.queues,
            tier=self.config.tier,
            specialties=self.config.specialties,
            fitness=self.config.fitness,
            window=self.config.window,
            jitter=self.config.jitter,
            zone_margin=self.config.zone_margin,
            pressure=self.config.pressure,
        )
        self._pool = ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix=f"contend-{self.name}"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prefetched: deque[Claimed] = deque()
        self._unknown_held: set[str] = set()
        self._housekeeping_due = asyncio.Event()
        self._inflight: set[str] = set()  # ids of outcomes being committed right now
        self._lane_credit = 0.0
        self._auctions: dict[str, tuple[Auction, bool]] = {}  # task -> (state, final)
        self._auction_wake: float | None = None  # store time of the next auction moment
        self.state = SlotState.IDLE
        self.started = asyncio.Event()

    # -- public ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask for a graceful stop (what SIGTERM does): no new claims, running tasks get the
        grace period, the rest is released for others to claim at once."""
        self._stopping.set()
        self._slot_free.set()

    @property
    def load(self) -> int:
        return len(self._runs)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._store = await self.app.store()
        await self._register()
        await self._refresh_cluster()
        self.started.set()
        log.info(
            "expert %s started: queues=%s concurrency=%d lease=%.1fs",
            self.name,
            ",".join(self.queues),
            self.config.concurrency,
            self.config.lease_ttl,
        )
        heart = asyncio.create_task(self._heartbeat_loop(), name="contend-heartbeat")
        keeper = asyncio.create_task(self._housekeeping_loop(), name="contend-housekeeping")
        committer = asyncio.create_task(self._commit_loop(), name="contend-committer")
        try:
            await self._claim_loop()
            await self._drain()
        finally:
            heart.cancel()
            keeper.cancel()
            self._outbox_ready.set()
            for result in await asyncio.gather(heart, keeper, return_exceptions=True):
                if isinstance(result, Exception):
                    log.error("expert %s: a background loop crashed: %r", self.name, result)
            await self._stop_committer(committer)
            await self._deregister()
            self._pool.shutdown(wait=False, cancel_futures=True)
            log.info(
                "expert %s stopped: done=%d failed=%d fenced_out=%d",
                self.name,
                self.stats.tasks_done,
                self.stats.tasks_failed,
                self.stats.fenced_out,
            )

    # -- session ---------------------------------------------------------------------------
    def _info(self) -> ExpertInfo:
        return ExpertInfo(
            id=self.name,
            capabilities=self.config.capabilities,
            queues=tuple(self.queues),
            capacity=self.config.concurrency,
            tier=self.config.tier,
            host=socket.gethostname(),
            pid=os.getpid(),
        )

    async def _register(self) -> None:
        assert self._store is not None
        try:
            self._session = await self._store.register_expert(self._info(), self.config.lease_ttl)
        except ExpertConflict:
            raise
        self._last_renewal = time.monotonic()

    async def _deregister(self) -> None:
        if self._store is not None and self._session is not None:
            try:
                await self._store.deregister_expert(self.name, self._session)
            except ContendError as exc:
                log.warning("expert %s: could not deregister: %s", self.name, exc)

    def _lease_safe(self) -> bool:
        """False once more than a lease has passed without a successful renewal (measured on
        this host's monotonic clock: a duration, never a comparison with the store's clock)."""
        return time.monotonic() - self._last_renewal < self.config.lease_ttl

    def _beat(self) -> Heartbeat:
        s = self.stats
        metrics = self.competition.metrics(s.claim_attempts, s.claims_won)
        metrics["prefetched"] = len(self._prefetched)
        metrics["stolen"] = s.stolen
        return Heartbeat(self.load, s.claim_attempts, s.claims_won, s.tasks_done, metrics)

    async def _refresh_cluster(self) -> None:
        """Rivals, cluster load and, for an emergency expert, whether to join in."""
        assert self._store is not None
        self.competition.update_peers(await self._store.list_experts(), self.load)
        if self.config.tier == "emergency":
            was = self.competition.active
            now = self.competition.update_pressure(
                await self._store.backlog(self.queues), self.load
            )
            if now != was:
                log.info(
                    "expert %s (emergency) %s",
                    self.name,
                    "joins: the cluster is under pressure" if now else "stands down",
                )
                self._slot_free.set()

    async def _heartbeat_loop(self) -> None:
        assert self._store is not None
        every = self.config.heartbeat_every
        sent = time.monotonic()
        while True:
            # on a fixed cadence, whatever the last renewal or housekeeping cost
            await asyncio.sleep(max(0.0, sent + every - time.monotonic()))
            if not self._lease_safe():
                await self._lose_lease("no renewal within the lease")
                continue
            try:
                assert self._session is not None
                sent = time.monotonic()
                held = await self._store.renew(
                    self.name, self._session, self.config.lease_ttl, self._beat()
                )
                self._last_renewal = sent
                log.debug(
                    "expert %s renewed its lease; the store says it holds %d", self.name, len(held)
                )
            except LeaseLost as exc:
                await self._lose_lease(str(exc))
                continue
            except ContendError as exc:
                log.warning("expert %s: renewal failed, will retry: %s", self.name, exc)
                continue
            for task_id, run in list(self._runs.items()):
                if held.get(task_id) != run.claimed.fence and not run.outcome_sent:
                    log.warning(
                        "expert %s: task %s (fence %d) is no longer ours; stopping it",
                        self.name,
                        task_id,
                        run.claimed.fence,
                    )
                    self._abandon(run)
            kept = [c for c in self._prefetched if held.get(c.id) == c.fence]
            self.stats.stolen_from_me += len(self._prefetched) - len(kept)
            self._prefetched = deque(kept)
            await self._release_orphans(held)
            self._housekeeping_due.set()

    async def _housekeeping_loop(self) -> None:
        """Expire lapsed leases, age pending tasks, refresh the view of rivals — after each
        renewal, but apart from it: slow housekeeping on a big store never delays a renewal."""
        assert self._store is not None
        while True:
            await self._housekeeping_due.wait()
            self._housekeeping_due.clear()
            try:
                await self._store.expire()
                await self._refresh_cluster()
                self.stats.heartbeats += 1
            except ContendError as exc:
                log.warning("expert %s: housekeeping failed: %s", self.name, exc)

    async def _release_orphans(self, held: dict[str, int]) -> None:
        """Tasks the store says this expert holds but it does not know of — a claim whose
        reply was lost and retried — would be renewed for ever and never run. One heartbeat
        of grace (the reply of a claim may be on its way), then they are released."""
        assert self._store is not None and self._session is not None
        known = set(self._runs) | {c.id for c in self._prefetched}
        known |= {o.task_id for o in self._outbox} | self._inflight
        unknown = {tid for tid in held if tid not in known}
        orphans = [(tid, held[tid]) for tid in sorted(unknown & self._unknown_held)]
        self._unknown_held = unknown - {tid for tid, _ in orphans}
        if not orphans:
            return
        try:
            results = await self._store.release(self.name, orphans)
        except ContendError as exc:
            log.warning("expert %s: could not release orphaned claims: %s", self.name, exc)
            return
        n = sum(1 for r in results if r is None)
        log.warning(
            "expert %s released %d task(s) it held in the store without knowing of them "
            "(a claim reply was lost)",
            self.name,
            n,
        )

    async def _lose_lease(self, why: str) -> None:
        """Seed 002: release everything held at once and commit nothing of it."""
        self.stats.leases_lost += 1
        runs = list(self._runs.values())
        unsent = len(self._outbox)
        log.error(
            "expert %s lost its lease (%s): stopping %d running task(s) and dropping %d "
            "finished result(s); committing none",
            self.name,
            why,
            len(runs),
            unsent,
        )
        for run in runs:
            self._abandon(run)
        self._outbox.clear()
        self._prefetched.clear()
        if self._stopping.is_set():
            return
        try:
            await self._register()
            log.info("expert %s: new session registered", self.name)
        except ContendError as exc:
            log.error("expert %s: could not register a new session: %s", self.name, exc)

    def _abandon(self, run: _Run) -> None:
        run.ctx._cancelled = True
        run.outcome_sent = True  # nothing of this run may be committed
        if run.task is not None:
            run.task.cancel()
        self._runs.pop(run.claimed.id, None)
        self._slot_free.set()

    # -- claiming --------------------------------------------------------------------------
    async def _claim_loop(self) -> None:
        assert self._store is not None
        store = self._store
        while not self._stopping.is_set():
            free = self.config.concurrency - len(self._runs)
            room = self.config.prefetch - len(self._prefetched)
            if free <= 0 and room <= 0:
                self._slot_free.clear()
                if self.config.concurrency - len(self._runs) <= 0:
                    await self._slot_free.wait()
                continue
            if not self._lease_safe():
                await asyncio.sleep(self.config.heartbeat_every / 10)
                continue
            if not self.competition.active:  # an emergency expert while all is calm
                self.state = SlotState.IDLE
                self._slot_free.clear()
                await self._wait_slot_or_stop(self.config.heartbeat_every)
                continue
            self.state = SlotState.CLAIMING
            try:
                if free > 0 and self._prefetched:
                    claimed = await self._start_prefetched(store, free)
                elif free > 0:
                    claimed = await self._compete(store, free)
                    if not claimed:
                        claimed = await self._steal(store, free)
                else:
                    claimed = []
                if room > 0 and not (free > 0 and not claimed):
                    await self._prefetch(store, room)
            except LeaseLost as exc:
                await self._lose_lease(str(exc))
                continue
            except ContendError as exc:
                log.warning("expert %s: claim failed: %s", self.name, exc)
                await self._pause(0.5)
                continue
            if claimed:
                self.state = SlotState.EXECUTING
                for c in claimed:
                    self._launch(c)
                await asyncio.sleep(0)
                continue
            if free <= 0:  # full, prefetch topped up: wait for a slot
                self._slot_free.clear()
                await self._wait_slot_or_stop(self.config.idle_wait)
                continue
            self.state = SlotState.IDLE if not self._runs else SlotState.EXECUTING
            await self._idle(store)

    # -- prefetch and work stealing (seed 003) ---------------------------------------------
    async def _prefetch(self, store: Store, room: int) -> None:
        """Claim a few tasks ahead, unstarted (``claimed``): they start the moment a slot frees,
        unless an idle expert steals them first."""
        self._prefetched.extend(await self._claim(store, room, start=False))

    async def _start_prefetched(self, store: Store, free: int) -> list[Claimed]:
        batch = [self._prefetched.popleft() for _ in range(min(free, len(self._prefetched)))]
        results = await store.start(self.name, [(c.id, c.fence) for c in batch])
        started = []
        for c, res in zip(batch, results, strict=True):
            if res is None:
                started.append(c)
            else:
                self.stats.stolen_from_me += 1
                log.info("expert %s: prefetched task %s was taken over (%s)", self.name, c.id, res)
        return started

    async def _steal(self, store: Store, free: int) -> list[Claimed]:
        """An idle expert takes unstarted tasks from an expert loaded above the steal ratio."""
        assert self._session is not None
        ratio = self.config.steal_ratio
        if ratio is None:
            return []
        victims = sorted(
            (
                p
                for p in self.competition.peers
                if p.alive
                and p.info.id != self.name
                and int(p.metrics.get("prefetched", 0) or 0) > 0
                and p.load / max(1, p.info.capacity) >= ratio
                and set(self.queues) & set(p.info.queues)
            ),
            key=lambda p: -int(p.metrics.get("prefetched", 0) or 0),
        )
        for victim in victims:
            got = await store.steal(
                self.name,
                self._session,
                victim.info.id,
                self.queues,
                self.config.capabilities,
                limit=free,
                lease_ttl=self.config.lease_ttl,
            )
            if got:
                self.stats.stolen += len(got)
                log.info("expert %s stole %d task(s) from %s", self.name, len(got), victim.info.id)
                return got
        return []

    async def _wait_slot_or_stop(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._slot_free.wait(), seconds)
        except TimeoutError:
            pass

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    async def _idle(self, store: Store) -> None:
        wait = self.config.idle_wait
        due = await store.next_due(self.queues)
        now = await store.now()
        if due is not None:
            # A task due later: wake up for it. One due already that we did not get is not
            # ours (another expert's requirements, or a lost race): wait for a change.
            until = due - now
            if until > 0:
                wait = min(wait, until)
        if self._auction_wake is not None:
            wait = max(0.001, min(wait, self._auction_wake - now))
        if wait > 0:
            waiter = asyncio.create_task(store.wait_for_change(wait))
            stopper = asyncio.create_task(self._stopping.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in (waiter, stopper):
                t.cancel()
            await asyncio.gather(waiter, stopper, return_exceptions=True)

    def _auction_types(self) -> set[str]:
        """Task types this expert auctions now: mode "auction", and mode "auto" once their runs
        take long enough to pay for an auction (seed 000 §6.1)."""
        out = set()
        typical = self.competition.typical
        mine = self.competition.tracker.snapshot()
        for tt in self.app.tasks.values():
            if tt.mode == "auction":
                out.add(tt.name)
            elif tt.mode == "auto":
                mean = typical.get(tt.name) or (
                    mine[tt.name].mean_seconds if tt.name in mine else None
                )
                if mean is not None and mean >= self.config.auction_threshold:
                    out.add(tt.name)
        return out

    def _lane_slots(self, free: int) -> int:
        """How many of *free* slots go to the low lane (the longest-waiting tasks, whatever
        their priority): a running credit, so that over time the share is LOW_LANE_SHARE even
        when slots free up one at a time."""
        self._lane_credit += LOW_LANE_SHARE * free
        slots = min(free, int(self._lane_credit))
        self._lane_credit -= slots
        return slots

    async def _claim(
        self,
        store: Store,
        limit: int,
        *,
        task_ids: list[str] | None = None,
        start: bool = True,
        low_lane: int = 0,
    ) -> list[Claimed]:
        """The one place this expert claims, and counts attempts: a claim of named tasks
        attempts up to *limit* of them (what it does not get, a rival won); a claim of whatever
        is best never loses a race."""
        assert self._session is not None
        if task_ids is not None and not task_ids:
            return []
        got = await store.claim(
            self.name,
            self._session,
            self.queues,
            self.config.capabilities,
            limit=limit,
            lease_ttl=self.config.lease_ttl,
            task_ids=task_ids,
            start=start,
            low_lane=low_lane,
        )
        self.stats.claim_attempts += len(got) if task_ids is None else min(len(task_ids), limit)
        self.stats.claims_won += len(got)
        return got

    async def _compete(self, store: Store, free: int) -> list[Claimed]:
        assert self._session is not None
        comp = self.competition
        auctioned = self._auction_types()
        lane = self._lane_slots(free)
        if not auctioned and not comp.race_matters(self.load):
            return await self._claim(store, free, low_lane=lane)
        # look deep enough that equally fit experts do not all reach for the same few tasks
        depth = max(16, free * 3)
        views = await store.peek(self.queues, self.config.capabilities, depth, low_lane=lane)
        self._auction_wake = None
        if not views:
            return []
        claimed: list[Claimed] = []
        lots = [v for v in views if v.type in auctioned]
        if lots:
            claimed = await self._bid_and_claim(store, lots, free)
            free -= len(claimed)
        races = [v for v in views if v.type not in auctioned]
        if not races or free <= 0:
            return claimed
        plan = comp.plan(races, self.load)
        first = plan[0][0]
        if first > 0:
            await self._pause(first)
            if self._stopping.is_set():
                return claimed
        # Offer the store every candidate this expert is about as fit for as for the first
        # one — more than it has room for: the store takes the best `free` still pending, so
        # tasks a fitter rival took in the meantime cost no lost race.
        slack = first + comp.window * 0.1
        ids = [tid for d, _, tid in plan if d <= slack]
        return claimed + await self._claim(store, free, task_ids=ids)

    async def _bid_and_claim(self, store: Store, lots: list[TaskView], free: int) -> list[Claimed]:
        """Auction mode: bid our fitness on each task; after the close, the top bidder claims,
        and each next bidder may after its grace period."""
        assert self._session is not None
        me = self.competition.me(self.load)
        grace = self.config.auction_grace
        entitled: list[str] = []
        now = await store.now()
        seen = {v.id for v in lots}
        for tid in [t for t in self._auctions if t not in seen]:
            del self._auctions[tid]  # claimed or gone: forget it (keeps the map bounded)
        for view in lots[: max(1, free)]:
            state = self._auctions.get(view.id)
            if state is None or (not state[1] and now >= state[0].closes_at):
                score = self.config.fitness(me, view)
                auction = await store.bid(
                    self.name, self._session, view.id, score, self.config.auction_window
                )
                state = (auction, auction.now >= auction.closes_at)
                self._auctions[view.id] = state
            auction, _ = state
            if not auction.open:
                continue
            at = auction.may_claim_at(self.name, grace)
            if now >= at:
                entitled.append(view.id)
            else:
                wake = at if now >= auction.closes_at else auction.closes_at
                self._auction_wake = min(self._auction_wake or wake, wake)
        return await self._claim(store, free, task_ids=entitled)

    # -- executing -------------------------------------------------------------------------
    def _launch(self, claimed: Claimed) -> None:
        assert self._loop is not None
        ctx = TaskContext(
            task_id=claimed.id,
            type=claimed.type,
            queue=claimed.queue,
            fence=claimed.fence,
            attempt=claimed.attempt,
            max_attempts=claimed.max_attempts,
            expert=self.name,
            state=claimed.checkpoint,
            _expert=self,
            _loop=self._loop,
        )
        run = _Run(claimed, ctx)
        self._runs[claimed.id] = run
        run.task = asyncio.create_task(self._execute(run), name=f"contend-task-{claimed.id}")

    async def _execute(self, run: _Run) -> None:
        c = run.claimed
        try:
            tt = self.app.tasks.get(c.type)
            if tt is None:
                self._fail(
                    run,
                    "UnknownTaskType",
                    f"expert {self.name} has no task type {c.type!r}",
                    retry=False,
                )
                return
            started = time.monotonic()
            ok: bool | None = None  # stays None when the run is abandoned (not its fault)
            try:
                result = await self._call(tt, run)
                text = encode_json(result, f"result of task {c.id}")
                ok = True
            except TimeoutError:
                ok = False
                limit = c.timeout or tt.timeout
                self._fail(run, "Timeout", f"task exceeded its {limit}s timeout", error=None, tt=tt)
            except PayloadError as exc:
                ok = False
                self._fail(run, "PayloadError", str(exc), retry=False)
            except Exception as exc:
                ok = False
                self._fail(
                    run,
                    type(exc).__name__,
                    str(exc),
                    error=exc,
                    tt=tt,
                    tb=traceback.format_exc(limit=20),
                )
            else:
                self._send(run, Completion(c.id, c.fence, text))
            finally:
                if ok is not None:
                    self.competition.tracker.record(c.type, ok, time.monotonic() - started)
        finally:
            if self._runs.get(c.id) is run:
                del self._runs[c.id]
            self._slot_free.set()

    async def _call(self, tt: TaskType, run: _Run) -> Any:
        c, ctx = run.claimed, run.ctx
        args = [ctx, *c.args] if tt.pass_context else list(c.args)
        timeout = c.timeout or tt.timeout
        token = _current.set(ctx)
        try:
            if tt.is_async:
                return await asyncio.wait_for(tt.fn(*args, **c.kwargs), timeout)
            assert self._loop is not None
            cv = contextvars.copy_context()
            fut = self._loop.run_in_executor(self._pool, lambda: cv.run(tt.fn, *args, **c.kwargs))
            try:
                return await asyncio.wait_for(fut, timeout)
            except (TimeoutError, asyncio.CancelledError):
                ctx._cancelled = True  # a thread cannot be interrupted: tell it to stop
                raise
        finally:
            _current.reset(token)

    def _fail(
        self,
        run: _Run,
        kind: str,
        message: str,
        *,
        error: BaseException | None = None,
        retry: bool = True,
        tt: TaskType | None = None,
        tb: str | None = None,
    ) -> None:
        c = run.claimed
        body: dict[str, Any] = {"type": kind, "message": message[:4000], "attempt": c.attempt}
        if tb:
            body["traceback"] = tb[-8000:]
        if not retry or tt is None:
            decision_retry, delay, final = False, None, TaskState.FAILED
        else:
            d = tt.retry.decide(c.attempt, error, max_attempts=c.max_attempts)
            decision_retry, delay, final = (
                d.retry,
                (d.delay if d.retry else None),
                TaskState(d.final_state),
            )
        if decision_retry:
            log.info(
                "task %s (%s) attempt %d failed: %s: %s; retry in %.2fs",
                c.id,
                c.type,
                c.attempt,
                kind,
                message[:200],
                delay or 0.0,
            )
        else:
            log.warning(
                "task %s (%s) attempt %d failed: %s: %s; now %s",
                c.id,
                c.type,
                c.attempt,
                kind,
                message[:200],
                final,
            )
        self._send(run, Failure(c.id, c.fence, json.dumps(body), delay, final))

    def _send(self, run: _Run, outcome: Completion | Failure) -> None:
        if run.outcome_sent:
            return
        run.outcome_sent = True
        self._outbox.append(outcome)
        self._outbox_ready.set()

    async def _checkpoint(self, ctx: TaskContext, text: str) -> None:
        assert self._store is not None
        if not self._lease_safe():
            raise FencedOut(ctx.task_id, ctx.fence, "this expert's lease lapsed")
        await self._store.checkpoint(self.name, ctx.task_id, ctx.fence, text)

    # -- committing ------------------------------------------------------------------------
    async def _commit_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            if self._outbox:
                await asyncio.sleep(0)  # let tasks finishing in this same tick join the batch
                await self._flush()
            if self._claiming_stopped.is_set() and not self._outbox:
                return

    async def _flush(self) -> None:
        assert self._store is not None
        batch, self._outbox = self._outbox, []
        if not batch:
            return
        self._inflight = {o.task_id for o in batch}
        try:
            await self._commit(batch)
        finally:
            self._inflight = set()

    async def _commit(self, batch: list[Completion | Failure]) -> None:
        assert self._store is not None
        if not self._lease_safe():
            self._outbox[:0] = batch
            await self._lose_lease("no renewal within the lease")
            return
        done = [o for o in batch if isinstance(o, Completion)]
        failed = [o for o in batch if isinstance(o, Failure)]
        for attempt in range(5):
            try:
                results: list[FencedOut | None] = []
                if done:
                    results += await self._store.complete(self.name, done)
                if failed:
                    results += await self._store.fail(self.name, failed)
                break
            except ContendError as exc:
                log.warning("expert %s: commit failed (try %d): %s", self.name, attempt + 1, exc)
                await asyncio.sleep(0.05 * 2**attempt * (1 + random.random()))
        else:
            log.error(
                "expert %s: giving up on %d commit(s); they will be released and run again",
                self.name,
                len(batch),
            )
            return
        for outcome, res in zip([*done, *failed], results, strict=True):
            if res is not None:
                self.stats.fenced_out += 1
                log.warning("expert %s: commit refused: %s", self.name, res)
            elif isinstance(outcome, Completion):
                self.stats.tasks_done += 1
            else:
                self.stats.tasks_failed += 1

    async def _stop_committer(self, committer: asyncio.Task[None]) -> None:
        self._claiming_stopped.set()
        self._outbox_ready.set()
        try:
            await asyncio.wait_for(committer, 10)
        except (TimeoutError, asyncio.CancelledError):
            committer.cancel()
        if self._outbox:
            await self._flush()

    # -- stopping --------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Let running tasks finish within the grace period; release the rest."""
        if self._runs:
            log.info(
                "expert %s stopping: waiting up to %.0fs for %d task(s)",
                self.name,
                self.config.grace,
                len(self._runs),
            )
        deadline = time.monotonic() + self.config.grace
        while self._runs and time.monotonic() < deadline:
            self._slot_free.clear()
            try:
                await asyncio.wait_for(self._slot_free.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        left = list(self._runs.values())
        unstarted = list(self._prefetched)
        self._prefetched.clear()
        if not left and not unstarted:
            return
        for run in left:
            run.outcome_sent = True
            run.ctx._cancelled = True
            if run.task is not None:
                run.task.cancel()
        await asyncio.gather(*(r.task for r in left if r.task is not None), return_exceptions=True)
        assert self._store is not None
        items = [(r.claimed.id, r.claimed.fence) for r in left]
        items += [(c.id, c.fence) for c in unstarted]
        try:
            res = await self._store.release(self.name, items)
            n = sum(1 for r in res if r is None)
            log.info("expert %s released %d unfinished task(s) for others", self.name, n)
        except ContendError as exc:
            log.warning("expert %s: release failed (leases will lapse instead): %s", self.name, exc)
