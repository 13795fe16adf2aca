"""The claim loop: discover claimable work, compete for it, claim it, hand it to the executor.

Per round it starts prefetched tasks when slots are free (``runtime.prefetch``), or competes
(``runtime.competition`` plans the race: fitness against rivals, race delays, tasks left to
faster rivals) and claims; auctions the task types that pay for one (``runtime.bidding``);
steals from a loaded rival when it got nothing; tops up its prefetch; and otherwise
waits for the store to change, for a task to fall due or for an auction moment. Every claim of
a round is made under one session; if that session is lost meanwhile, what the round claimed
is not started (the store hands it back once its lease lapses, or the next heartbeat releases
it as an orphan). Every store call is made under the round's session (``Session.call``), so
none is sent once the lease is unsafe and none is waited for past its deadline.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum

from contend.domain.scoring import TaskView
from contend.domain.task import LOW_LANE_SHARE
from contend.errors import ContendError, LeaseLost
from contend.runtime.bidding import Bidder, auction_types, below_top
from contend.runtime.clock import Clock, first_of, give_up, wait_event
from contend.runtime.competition import Competition, LeftToRivals
from contend.runtime.config import ExpertConfig
from contend.runtime.executor import Executor
from contend.runtime.hooks import Hook
from contend.runtime.pipeline import GATE_EVERY_CLOSED, Gate
from contend.runtime.prefetch import Prefetch, still_held
from contend.runtime.session import LeaseKeeper, Session
from contend.runtime.task_type import TaskType
from contend.store.port import Claimed, Outrun, Store

log = logging.getLogger("contend.expert")


class SlotState(StrEnum):
    IDLE = "idle"
    CLAIMING = "claiming"
    EXECUTING = "executing"


#: The most tasks an expert holds beyond its free slots by default, when its runs are so short
#: that two claims' time of them is more than that. It was the concurrency (8 by default), then
#: 64: two experts of 8 drained no-op tasks from PostgreSQL at 7,900-9,100/s with 8 and at
#: 16,900-17,900/s with 64. Against 64 in one run (2 x 8, 10,000 or 20,000 no-op tasks), 256
#: gave SQLite sync bodies 21,600-22,700/s against 16,900-17,100 (CPU 53-57 us a task against
#: 70-73), PostgreSQL async bodies 21,000-21,300/s against 13,400-16,000 (87-89 us against
#: 113-125) and etcd async bodies 6,800-6,900/s against 4,400-4,600 (235-246 us against
#: 350-361). At 256 the experts still sat idle: a claim of the 128 or so that topped the
#: stock up took 12-40 ms on etcd, longer than the stock lasted, so with no task held nor
#: running they waited for it (sampled: no slot busy most of the time, the machine 30 %
#: idle). Against 256 in one run (2 x 8, 30,000 no-op tasks, 3 pairs each, medians of the
#: pairs' ratios), 1024 drained etcd 1.35 times as fast (async and sync), SQLite 1.37 and
#: PostgreSQL 1.16, with less CPU per task on each; 512 gave etcd 1.18. It binds only on runs far shorter than a
#: claim's round trip; what is held is never more than two claims' time of work, as
#: ``ahead`` reckons it from the runs' mean duration, so a task held waits no longer than
#: that for its slot. A crashed expert's held tasks wait for its lease to lapse, as its
#: running ones do: the cap bounds how many.
AHEAD_MOST = 1024

#: An expert held back by a rate limit looks again at most this often.
RATE_POLL_MIN = 0.005


class ClaimLoop:
    """Keeps the executor's slots (and the prefetch) filled until stopped."""

    def __init__(
        self,
        store: Store,
        name: str,
        config: ExpertConfig,
        queues: list[str],
        tasks: Mapping[str, TaskType],
        *,
        competition: Competition,
        keeper: LeaseKeeper,
        executor: Executor,
        clock: Clock,
        hooks: Hook,
        stopping: asyncio.Event,
        gate: Gate | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.config = config
        #: Every queue this expert serves; ``queues`` is those open this round (a pipeline
        #: stage whose next queue is full waits: ``runtime.pipeline.Gate``).
        self.all_queues = list(queues)
        self.queues = queues
        self.gate = gate
        self.tasks = tasks
        #: The task types this expert claims: those its app has (a rolling deploy leaves the
        #: types only newer experts know to those experts).
        self.types = tuple(tasks)
        self.competition = competition
        self.keeper = keeper
        self.executor = executor
        self.clock = clock
        self.hooks = hooks
        self.stopping = stopping
        self.state = SlotState.IDLE
        self.prefetched = Prefetch(store, name, hooks)
        # Claimed ahead and started in the store, waiting here for a slot: filled only while
        # runs end sooner than a claim takes (see ``ahead``), so a slot that frees is refilled
        # at once instead of after a round trip.
        self.ready: deque[tuple[Claimed, Session]] = deque()
        self._ready_at: dict[str, float] = {}  # task id -> when its claim answered
        self.claim_seconds: float | None = None  # how long a claim takes, a moving average
        self._wake = asyncio.Event()
        self._lane_credit = 0.0
        #: the last claim of whatever is best came back short: the queues held no more than
        #: it asked for, so a low lane in the next one would reserve nothing for anybody
        self._short = False
        #: a claim of this round of whatever is best came back short: it took every task
        #: there was, so the next one comes with a change, which the idle wait hears
        self._drained = False
        #: a claim of this round came back without some of the tasks it tried (a rival was
        #: quicker: a race's named tasks, or an optimistic store's ``Outrun``): the loop
        #: looks again at once instead of waiting for a change
        self._outrun = False
        #: tasks claimed ahead were given back (``holds``): claim no more ahead until a run ends
        self._gave_back = False
        #: Tasks left to faster rivals for now (``Competition.deferrals``).
        self.left = LeftToRivals(competition, clock.monotonic)
        self.bidder = Bidder(store, name, config, competition, executor)
        #: The shortest interval of the rate limits of its task types: how soon to look again
        #: when a due task was held back (None: no rate limits, wait for a change).
        rates = [tt.rate_limit.interval for tt in tasks.values() if tt.rate_limit is not None]
        self._rate_poll = max(RATE_POLL_MIN, min(rates)) if rates else None
        # Fair share is decided when a claim is made: what an expert holds ahead runs before
        # the tasks of a key that arrives meanwhile. With fair types it holds no more than its
        # concurrency (64 let 180 tasks of one tenant run beside another's 20, against 52).
        fair = any(tt.fair for tt in tasks.values())
        self._ahead_most = config.concurrency if fair else max(AHEAD_MOST, config.concurrency)
        self._rand = random.random
        #: Done once the expert stops: what an idle wait watches besides the store (one task
        #: for the loop's life, not one per wait).
        self._stopped: asyncio.Task[bool] | None = None

    def wake(self) -> None:
        """Something worth a new round happened."""
        self._wake.set()

    def on_free(self) -> None:
        """A run ended: fill its slot from the tasks claimed ahead, then top them up."""
        self._gave_back = False
        ready = self.ready
        if ready and not self.stopping.is_set():
            executor, limit = self.executor, self.config.concurrency
            while ready and executor.load < limit:
                claimed, session = ready.popleft()
                self._ready_at.pop(claimed.id, None)
                if not session.safe():
                    continue  # its lease went (or ran out unnoticed): the store hands it back
                executor.launch(claimed, session)
        self._wake.set()

    # -- claiming ahead --------------------------------------------------------------------
    def ahead(self) -> int:
        """How many tasks to hold beyond the free slots: as many as end, at the runs' mean
        duration, in two claims' time, up to ``claim_ahead`` (default: AHEAD_MOST or the
        concurrency, whichever is more; the concurrency for an app with fair task types).
        Runs that take longer than a claim give none, so slow work is never hoarded."""
        cfg = self.config
        cap = self._ahead_most if cfg.claim_ahead is None else cfg.claim_ahead
        mean, rtt = self.executor.mean_run, self.claim_seconds
        if cap <= 0 or mean is None or rtt is None:
            return 0
        return min(cap, int(2 * rtt * cfg.concurrency / max(mean, 1e-6)))

    def holds(self, task_type: str) -> bool:
        """Whether a task of *task_type* may be held ahead: its own runs (not the mix's) end
        sooner than two claims' time spread over the slots. A type not run yet is not held:
        a burst of slow tasks after short ones was held on the short ones' mean (an expert
        of 2 slots held 36 tasks of 0.2 s while its rival sat idle)."""
        mean, rtt = self.executor.type_means.get(task_type), self.claim_seconds
        return mean is not None and rtt is not None and 2 * rtt * self.config.concurrency > mean

    def _keeps(self, c: Claimed) -> bool:
        """Whether *c*, claimed beyond the free slots, stays held: its type's runs are short
        (``holds``), or a leader gave it to this expert (a central queue's task given back is
        given out again: the suite saw one assigned twice)."""
        return c.queue in self.competition.central or self.holds(c.type)

    async def _give_back(self, session: Session, held: list[Claimed]) -> list[Claimed]:
        """Release those of *held* (claimed beyond the free slots) that are not to be held
        ahead, for a rival to claim at once; returns the rest. Nothing more is claimed ahead
        until a run ends: the tasks given back are the first a new claim would take again."""
        keep: list[Claimed] = []
        back: list[Claimed] = []
        for c in held:
            (keep if self._keeps(c) else back).append(c)
        self._gave_back = True
        items = [(c.id, c.fence) for c in back]
        try:
            await session.call("a release", lambda: self.store.release(self.name, items))
        except LeaseLost as exc:
            self.keeper.lose(session, str(exc))
            return []
        except ContendError as exc:  # their leases lapse instead
            log.warning("expert %s: could not give back %d task(s): %s", self.name, len(back), exc)
        return keep

    def take_ready(self) -> list[Claimed]:
        out = [c for c, _ in self.ready]
        self.ready.clear()
        self._ready_at.clear()
        return out

    def retain_ready(self, held: Mapping[str, int], sent: float) -> None:
        """Forget tasks claimed ahead that the store no longer gives this expert, by a renewal
        sent at *sent* (one claimed after that may not be in its answer yet)."""
        at = self._ready_at
        self.ready = deque((c, s) for c, s in self.ready if still_held(c, held, at, sent))
        self._ready_at = {c.id: at[c.id] for c, _ in self.ready if c.id in at}

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._run()
        finally:
            stopped, self._stopped = self._stopped, None
            if stopped is not None:
                stopped.cancel()
                await asyncio.gather(stopped, return_exceptions=True)

    async def _run(self) -> None:
        cfg = self.config
        while not self.stopping.is_set():
            free, room, extra = self._wants()
            if free > 0 and self.ready:
                self.on_free()  # slots freed while a claim was out
                continue
            if free <= 0 and room <= 0 and extra <= 0:
                self._wake.clear()
                if cfg.concurrency - self.executor.load <= 0:
                    await self._wake.wait()
                continue
            session = await self._usable_session()
            if session is None or await self._held_off(session):
                continue
            self.state = SlotState.CLAIMING
            try:
                claimed = await self._round(session, free, room, extra)
            except LeaseLost as exc:
                self.keeper.lose(session, str(exc))
                continue
            except ContendError as exc:
                log.warning("expert %s: claim failed: %s", self.name, exc)
                await self._pause(0.5)
                continue
            if claimed:
                await self._take(session, claimed)
                if self._drained and not self._outrun and not self.ready:
                    # It took all there was. Another claim now would come back empty (on
                    # etcd at 100 tasks/s, 3 claims in 4 did); the idle wait returns at once
                    # for a change made meanwhile, this claim's time included.
                    await self._idle_round(session)
            elif self._outrun:  # a rival took what it named: more may be pending, look again
                self._outrun = False
                # after a pause of up to a claim's time, so that rivals that collided claim
                # at different moments next time
                await self._pause((self.claim_seconds or 0.0) * self._rand())
            elif free <= 0:  # full, prefetch topped up: wait for a slot
                # ...if none freed while the round was out: that run's wake-up came before
                # this clear, and waiting for the next one left a free slot idle for
                # idle_wait (sync bodies on PostgreSQL: pickup p50 505 ms at 1,000 tasks/s)
                self._wake.clear()
                if cfg.concurrency - self.executor.load <= 0:
                    await wait_event(self.clock, self._wake, cfg.idle_wait)
            else:
                await self._idle_round(session)

    def _wants(self) -> tuple[int, int, int]:
        """Free slots, prefetch room, and how many more to claim ahead of the slots."""
        free = self.config.concurrency - self.executor.load
        room = self.config.prefetch - len(self.prefetched)
        # Tasks held ready are topped up once half of them are gone, not one by one: a
        # claim per started task was a write per task (sync no-op tasks on SQLite: four
        # times the transactions of coroutines, 10 tasks a claim against 31).
        want, holding = self.ahead(), len(self.ready)
        # Nothing more after a give-back (until a run ends), nor after a claim that took
        # every task there was: no backlog to hold ahead of, and what this expert held
        # would wait for its slots while an idle rival could start it (sync bodies at
        # 1,000 tasks/s on PostgreSQL: claims of 18 tasks for 8 slots, a claimed task
        # waiting 6 ms to start against 3 for coroutines).
        topping_up = holding * 2 <= want and not self._gave_back and not self._short
        return free, room, max(0, want - holding) if topping_up else 0

    def _resting(self) -> SlotState:
        return SlotState.IDLE if not self.executor.load else SlotState.EXECUTING

    async def _usable_session(self) -> Session | None:
        """The session to claim under, or None after waiting for the keeper to open one."""
        session = self.keeper.session
        if session is None or session.lost.is_set():
            # no session: wait for the keeper to open one (it backs off while it cannot)
            self.state = self._resting()
            await wait_event(self.clock, self.keeper.ready, self.config.heartbeat_every)
            return None
        if not session.safe():  # its deadline passed a moment ago: nothing more under it
            self.keeper.lose(session, "no renewal within the lease")
            return None
        return session

    async def _held_off(self, session: Session) -> bool:
        """Whether to claim nothing this time (and wait a while): every stage it serves waits
        for the ones after, or it is an emergency expert while all is calm."""
        gate = self.gate
        if gate is not None and gate.active:
            try:
                read = functools.partial(gate.open_queues, self.all_queues)
                self.queues = await session.call("a backlog read", read)
            except ContendError as exc:
                log.warning("expert %s: could not read the backlog: %s", self.name, exc)
                self.queues = [q for q in self.all_queues if q not in gate.closed]
            if not self.queues:
                self.state = self._resting()
                self._wake.clear()
                await wait_event(self.clock, self._wake, GATE_EVERY_CLOSED)
                return True
        if not self.competition.active:
            self.state = SlotState.IDLE
            self._wake.clear()
            await wait_event(self.clock, self._wake, self.config.heartbeat_every)
            return True
        return False

    async def _take(self, session: Session, claimed: list[Claimed]) -> None:
        """Start what *claimed* has room for; hold the rest ready (or give it back)."""
        self.state = SlotState.EXECUTING
        slots = self.config.concurrency - self.executor.load
        for c in claimed[:slots]:
            self.executor.launch(c, session)
        held = claimed[max(0, slots) :]
        if held and not all(self._keeps(c) for c in held):
            held = await self._give_back(session, held)
        self.ready.extend((c, session) for c in held)
        if held:
            now = self.clock.monotonic()
            self._ready_at.update((c.id, now) for c in held)
        await asyncio.sleep(0)

    async def _idle_round(self, session: Session) -> None:
        self.state = self._resting()
        try:
            await self._idle(session)
        except LeaseLost as exc:
            self.keeper.lose(session, str(exc))
        except ContendError as exc:
            log.warning("expert %s: could not read the store: %s", self.name, exc)
            await self._pause(0.5)

    async def _round(self, session: Session, free: int, room: int, extra: int) -> list[Claimed]:
        """One round under *session*: what to start now (up to *free*, plus *extra* to hold
        ready); the prefetch topped up."""
        self._drained = False
        self._outrun = False
        if free > 0 and self.prefetched:
            claimed = await self.prefetched.start(session, free)
        elif free + extra > 0:
            claimed = await self._compete(session, max(0, free), extra)
            if not claimed and free > 0:
                claimed = await self.prefetched.steal(
                    session,
                    self.config,
                    self.competition,
                    self.queues,
                    self.types,
                    free,
                )
        else:
            claimed = []
        ahead: list[Claimed] = []
        if room > 0 and not (free > 0 and not claimed):
            # claimed ahead, unstarted: they start the moment a slot frees, unless an idle
            # expert steals them first. Never an auctioned type: its tasks go to the top
            # bidder, not to whoever prefetches first.
            auctioned = auction_types(
                self.tasks.values(), self.competition, self.config.auction_threshold
            )
            kinds = tuple(t for t in self.types if t not in auctioned)
            if kinds:
                ahead = await self._claim(session, room, start=False, types=kinds)
        if session.lost.is_set():
            return []  # lost meanwhile: start nothing of it
        self.prefetched.add(ahead, self.clock.monotonic())
        return claimed

    # -- competing -------------------------------------------------------------------------
    async def _claim(
        self,
        session: Session,
        limit: int,
        *,
        task_ids: list[str] | None = None,
        start: bool = True,
        low_lane: int = 0,
        types: tuple[str, ...] | None = None,
        queues: list[str] | None = None,
    ) -> list[Claimed]:
        """The one place this expert claims, and counts attempts: a claim of named tasks
        attempts up to *limit* of them (what it does not get, a rival won); a claim of whatever
        is best never loses a race. *types*: only these of the app's task types; *queues*:
        only these of its queues."""
        if task_ids is not None and not task_ids:
            return []
        claim = functools.partial(
            self.store.claim,
            self.name,
            session.id,
            self.queues if queues is None else queues,
            self.config.capabilities,
            limit=limit,
            lease_ttl=self.config.lease_ttl,
            task_ids=task_ids,
            start=start,
            low_lane=low_lane,
            types=self.types if types is None else types,
        )
        sent = self.clock.monotonic()
        got = await session.call("a claim", claim)
        took = self.clock.monotonic() - sent
        last = self.claim_seconds
        self.claim_seconds = took if last is None else last + 0.2 * (took - last)
        # short because rivals took some of what it tried, not because the queues ran dry:
        # neither drained nor short (the lane and topping up stay)
        outrun = isinstance(got, Outrun)
        self._outrun = self._outrun or outrun
        if task_ids is None and queues is None:
            self._short = len(got) < limit and not outrun
            self._drained = self._drained or self._short
        # every id named counts: one not won is a lost race
        attempted = len(got) if task_ids is None else len(task_ids)
        if attempted:
            self.hooks.on_claimed(self.name, got, attempted)
        return got

    def _lane_slots(self, free: int) -> int:
        """How many of *free* slots go to the low lane (the longest-waiting tasks, whatever
        their priority): a running credit, so that over time the share is LOW_LANE_SHARE even
        when slots free up one at a time."""
        self._lane_credit += LOW_LANE_SHARE * free
        slots = min(free, int(self._lane_credit))
        self._lane_credit -= slots
        return slots

    async def _compete(self, session: Session, free: int, extra: int = 0) -> list[Claimed]:
        """Claim for *free* slots and *extra* to hold ready; when the race or an auction
        decides, for the free slots alone."""
        comp = self.competition
        # only this round's race may leave tasks to rivals: a wake-up for tasks left in an
        # earlier one that has passed would turn every idle wait into a 1 ms poll
        self.left.wake = None
        load = self.executor.load + len(self.ready)
        auctioned = auction_types(self.tasks.values(), comp, self.config.auction_threshold)
        # No lane after a short claim: every claimable task was taken then, the low ones with
        # the rest, and the lane's part of the statement is most of a one-task claim's cost
        # (PostgreSQL: 0.24 ms of server time against 0.12 without). The first claim that
        # comes back full brings it back.
        lane = 0 if self._short else self._lane_slots(free + extra)
        if not auctioned and not comp.race_matters(load):
            return await self._claim(session, free + extra, low_lane=lane)
        # A race places each task on the fittest expert: claim only for the free slots, so
        # that holding ahead never takes a task a fitter rival would win.
        if free <= 0:
            return []
        central = [q for q in self.queues if q in comp.central]
        if central:  # given by a leader: claimed at once, before any race (and not peeked)
            given = await self._claim(session, free, queues=central)
            if given:
                return given
        # look deep enough that equally fit experts do not all reach for the same few tasks
        depth = comp.peek_depth(free)
        peek = functools.partial(
            self.store.peek,
            self.queues,
            self.config.capabilities,
            depth,
            low_lane=lane,
            types=self.types,
        )
        views = await session.call("a read", peek)
        self.bidder.wake_at = None
        if not views:
            return []
        claimed: list[Claimed] = []
        lots = [v for v in views if v.type in auctioned and v.queue not in comp.fifo]
        if lots and free > 0:
            claimed = await self._bid_and_claim(session, lots, free, lane)
            free -= len(claimed)
            lane = 0
        bid_on = {v.id for v in lots}
        races = [v for v in views if v.id not in bid_on]
        # a peek that came back short saw every claimable task: what stands before each
        # is known, and some may be left to faster rivals
        races = self.left.keep(races, load, shallow=len(views) < depth)
        if not races or free <= 0:
            return claimed
        return claimed + await self._race(session, races, free, load, lane, peek)

    async def _race(
        self,
        session: Session,
        races: list[TaskView],
        free: int,
        load: int,
        lane: int,
        peek: Callable[[], Awaitable[list[TaskView]]],
    ) -> list[Claimed]:
        """Wait out this expert's race delay for *races* (as fit as its rivals are), then
        claim the best of them still pending for its *free* slots."""
        comp = self.competition
        plan = comp.plan(races, load, self.claim_seconds or 0.0)
        first = plan[0][0]
        if first > 0:
            await self._pause(first)
            if self.stopping.is_set():
                return []
        # The candidates this expert is about as fit for as for the first one, best first.
        # It names no more of them than it has free slots: every id named and not won is a
        # lost race (issue 13 counts each one), and after the late check below nearly all are
        # still there; one a rival took meanwhile is claimed in the next round. Naming every
        # candidate instead (the store took the best `free`) won 15-38 % of the ids named in
        # the simulator, with the same placement.
        slack = first + comp.window * 0.1
        # in the store's order (the peek's), as the store would take the best of them
        ids = [tid for _, _, tid in sorted((p for p in plan if p[0] <= slack), key=lambda p: p[1])]
        planned = len(ids)
        if first > 0:
            # Late check: a fitter rival went first and has most likely taken these by now.
            # A read says which are still there: a claim of gone ones is a lost race, a write
            # that every expert that waited would make for nothing (3.3 claims per task in
            # the simulator's 50-expert stream, 1.0 with the check, placement unchanged).
            still = {v.id for v in await session.call("a read", peek)}
            ids = [tid for tid in ids if tid in still]
            races = [v for v in races if v.id in still]
        if lane:
            # the low lane's candidates, the longest waiting below the top priority, are
            # named whoever is fitter for them, in place of as many of the best: the store
            # gives the lane its share of them (Store.claim), so a flood of urgent work
            # starves nothing on the race path either
            best = set(ids[:free])
            low = sorted(
                (v for v in below_top(races) if v.id not in best),
                key=lambda v: (v.created_at, v.id),
            )[: min(lane, free)]
            ids = ids[: free - len(low)] + [v.id for v in low]
        else:
            ids = ids[:free]
        got = await self._claim(session, free, task_ids=ids, low_lane=lane)
        # a rival took some of them, before the late check or after: more may be pending
        # (the other candidates), so look again at once rather than wait for the next change
        # of work (a task's end is none: a batch's last tasks waited out the idle wait)
        self._outrun = len(got) < len(ids) or len(ids) < min(planned, free)
        return got

    async def _bid_and_claim(
        self, session: Session, lots: list[TaskView], free: int, lane: int = 0
    ) -> list[Claimed]:
        """Auction mode (``runtime.bidding``): bid on the lots, claim those this expert may."""
        entitled = await self.bidder.entitled(session, lots, free, lane)
        return await self._claim(session, free, task_ids=entitled, low_lane=lane)

    # -- waiting ---------------------------------------------------------------------------
    async def _pause(self, seconds: float) -> None:
        await wait_event(self.clock, self.stopping, seconds)

    async def _idle(self, session: Session) -> None:
        """Wait for the store to change, a task to fall due or an auction moment."""
        wait = self.config.idle_wait
        if self.gate is not None and self.gate.closed:
            wait = min(wait, GATE_EVERY_CLOSED)  # a stage waits for the next: look again soon
        # a task due already that we did not get matters only to a rate limit's poll below
        later = self._rate_poll is None
        due = await session.call("a read", lambda: self.store.next_due(self.queues, later=later))
        if due is None and self.bidder.wake_at is None:
            now = 0.0  # nothing to time: spare the store a round trip per idle wake-up
        else:
            now = await session.call("a read", self.store.now)
        if due is not None:
            # A task due later: wake up for it. One due already that we did not get is not
            # ours (another expert's requirements, or a lost race): wait for a change.
            until = due - now
            if until > 0:
                wait = min(wait, until)
            elif self._rate_poll is not None:
                # or held back by a rate limit: look again when the key may have room
                # (jittered, so that rivals polling the same key spread out)
                wait = min(wait, self._rate_poll * (0.5 + self._rand()))
        if self.bidder.wake_at is not None:
            wait = max(0.001, min(wait, self.bidder.wake_at - now))
        left = self.left.take_wake()
        if left is not None:  # a task left to faster rivals becomes this one's
            wait = max(0.001, min(wait, left - self.clock.monotonic()))
        if wait <= 0:
            return
        # Work only: a task's end wakes nobody unless it frees something (its limit's slot,
        # its dependants), or unless a rival holds tasks claimed ahead that this expert
        # may steal once the rival's load changes.
        steals = self.config.steal_ratio is not None and self.competition.loaded
        wait_for = self.store.wait_for_change if steals else self.store.wait_for_work
        waiter = asyncio.create_task(wait_for(wait))
        if self._stopped is None:
            self._stopped = asyncio.create_task(self.stopping.wait())
        try:
            # the store's own timeout is on the host's clock; the expert's bounds the wait too
            await first_of(self.clock, (waiter, self._stopped), wait)
        finally:
            give_up(waiter)  # a store's wait is not waited for either
