"""The expert: a worker that contends for tasks, runs them under a lease and commits with its fence.

Per slot it moves ``IDLE → CLAIMING → EXECUTING → IDLE`` (seed 002). :class:`Expert` only
composes parts with one job each, sharing one event loop:

* the **lease keeper** (``runtime.session``) registers the session and renews it on a fixed
  cadence — one call keeps every held task's lease alive — and declares it *lost* when the
  store says so or a whole lease passes without a renewal; the expert then stops every task it
  holds at once and commits nothing of them;
* the **claim loop** (``runtime.claimer``) waits for work, competes for it (fitness and race
  delays from ``runtime.competition``), claims, prefetches, steals and auctions;
* the **executor** (``runtime.executor``) runs claimed tasks, async or sync, under their
  timeout, and turns each run into a result or a failure decided by the retry policy;
* the **committer** (``runtime.committer``) groups outcomes into fenced ``complete``/``fail``
  calls;
* **housekeeping** (``runtime.housekeeping``), after each renewal but apart from it, expires
  lapsed leases and refreshes the view of rivals;
* the **ticker** (``runtime.ticker``) submits the ticks of the app's periodic task types;
* the **dispatcher** (``runtime.dispatcher``), for an expert serving ``central`` queues, takes
  part in their leader elections and, while it leads one, assigns its tasks;
* with ``--gossip``, the **gossip node** (``contend.gossip``) publishes the expert's load at each
  heartbeat and hands housekeeping its rivals, so that it no longer reads them from the store.

Time comes from an injected :class:`~contend.runtime.clock.Clock`; counters, logs of task
outcomes and anything cross-cutting plug in as :class:`~contend.runtime.hooks.Hook` objects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from contend.errors import ContendError, shown_url
from contend.gossip import GossipNode, summary
from contend.runtime import tracing
from contend.runtime.app import App
from contend.runtime.claimer import ClaimLoop, SlotState
from contend.runtime.clock import Clock, SystemClock, settle_strays
from contend.runtime.committer import Committer
from contend.runtime.competition import Competition
from contend.runtime.config import ExpertConfig
from contend.runtime.dispatcher import Dispatcher
from contend.runtime.executor import Executor
from contend.runtime.hooks import ExpertStats, Hook, Hooks, TaskLog
from contend.runtime.housekeeping import Housekeeper
from contend.runtime.pipeline import Gate
from contend.runtime.session import LeaseKeeper, Session
from contend.runtime.ticker import Ticker
from contend.store.port import Claimed, ExpertInfo, Heartbeat, Store

__all__ = ["Expert", "ExpertConfig", "ExpertStats", "SlotState"]

log = logging.getLogger("contend.expert")

#: Where an expert reads the gossip cluster's keys when its config gives none.
GOSSIP_KEY_ENV = "CONTEND_GOSSIP_KEY"
#: How long a stopping expert waits for the store calls it gave up on to end, seconds.
STRAYS_WAIT = 5.0


class _Parts:
    """The parts of one running expert, made when it starts (they need its store)."""

    def __init__(self, expert: Expert, store: Store) -> None:
        e, cfg = expert, expert.config
        self.keeper = LeaseKeeper(
            store,
            e.info(),
            ttl=cfg.lease_ttl,
            every=cfg.heartbeat_every,
            clock=e.clock,
            hooks=e.hooks,
            beat=e._beat,
            on_renewed=e._renewed,
            on_lost=e._lost,
            on_fatal=e._fatal,
        )
        self.committer = Committer(
            store, e.name, clock=e.clock, hooks=e.hooks, lose=self.keeper.lose
        )
        self.executor = Executor(
            store,
            e.name,
            e.app.tasks,
            concurrency=cfg.concurrency,
            clock=e.clock,
            hooks=e.hooks,
            tracker=e.competition.tracker,
            deliver=self.committer.send,
            on_free=e._wake_claimer,
        )
        self.claimer = ClaimLoop(
            store,
            e.name,
            cfg,
            e.queues,
            e.app.tasks,
            competition=e.competition,
            keeper=self.keeper,
            executor=self.executor,
            clock=e.clock,
            hooks=e.hooks,
            stopping=e._stopping,
            gate=Gate(store, e.app.pipelines.values(), e.queues, e.clock),
        )
        self.executor.on_free = self.claimer.on_free  # once per task: no wrapper in between
        if self.claimer.gate is not None:
            self.executor.on_forwarded = self.claimer.gate.note
        self.gossip = e.gossip_node()
        self.housekeeper = Housekeeper(
            store,
            e.name,
            e.queues,
            competition=e.competition,
            load=lambda: self.executor.load,
            on_join_or_leave=e._wake_claimer,
            hooks=e.hooks,
            retention=cfg.retention,
            monotonic=e.clock.monotonic,
            peers=self.gossip.records if self.gossip is not None else None,
        )
        self.ticker = Ticker(
            e.app, store, e.name, clock=e.clock, stopping=e._stopping, retention=cfg.retention
        )
        central = sorted(e.competition.central)
        self.dispatcher = (
            Dispatcher(
                store,
                e.name,
                central,
                keeper=self.keeper,
                competition=e.competition,
                fitness=cfg.fitness,
                lease_ttl=cfg.lease_ttl,
                clock=e.clock,
                stopping=e._stopping,
            )
            if central
            else None
        )


class Expert:
    """Runs task types of *app* from its store until stopped.

    *hooks* are called at each moment of a task's life (see ``runtime.hooks``), after the
    expert's own counters (``expert.stats``) and task log; *clock* (default: the system's)
    is where every timer and duration of the expert comes from."""

    def __init__(
        self,
        app: App,
        config: ExpertConfig | None = None,
        *,
        hooks: Iterable[Hook] = (),
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        self.app = app
        self.config = config or ExpertConfig(**options)
        self.config.validate()
        self.name = self.config.name or f"{socket.gethostname()}-{os.getpid()}"
        self.queues = list(self.config.queues or app.queues)
        self.clock: Clock = clock or SystemClock()
        self.stats = ExpertStats()
        hooks = list(hooks)
        if tracing.enabled() and not any(isinstance(h, tracing.TracingHook) for h in hooks):
            hooks.append(tracing.TracingHook())  # OpenTelemetry is set up: trace the tasks
        self.hooks = Hooks([self.stats, TaskLog(), *hooks])
        #: The task types this expert gets the specialist's edge on: those named, or for the
        #: specialized tier with none named, every type its app has.
        self.specialties = self.config.specialties or (
            frozenset(app.tasks) if self.config.tier == "specialized" else frozenset()
        )
        self.competition = Competition(
            self.name,
            self.config.capabilities,
            self.config.concurrency,
            self.queues,
            tier=self.config.tier,
            specialties=self.specialties,
            fitness=self.config.fitness,
            window=self.config.window,
            jitter=self.config.jitter,
            zone_margin=self.config.zone_margin,
            pressure=self.config.pressure,
            fifo=frozenset(q for q, m in app.queue_modes.items() if m == "fifo"),
            central=frozenset(q for q in self.queues if app.queue_modes.get(q) == "central"),
        )
        self.parts: _Parts | None = None
        self.error: ContendError | None = None  # why the expert stopped on its own
        self._stopping = asyncio.Event()
        self.started = asyncio.Event()

    # -- public ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask for a graceful stop (what SIGTERM does): no new claims, running tasks get the
        grace period, the rest is released for others to claim at once. Asked again after
        ``config.grace`` was lowered, it cuts the wait short."""
        self._stopping.set()
        if self.parts is not None:
            self.parts.keeper.wind_down()
            self.parts.executor.hurry()
        self._wake_claimer()

    @property
    def load(self) -> int:
        return self.parts.executor.load if self.parts else 0

    @property
    def state(self) -> SlotState:
        return self.parts.claimer.state if self.parts else SlotState.IDLE

    @property
    def session(self) -> Session | None:
        return self.parts.keeper.session if self.parts else None

    def info(self) -> ExpertInfo:
        return ExpertInfo(
            id=self.name,
            capabilities=self.config.capabilities,
            queues=tuple(self.queues),
            capacity=self.config.concurrency,
            tier=self.config.tier,
            host=socket.gethostname(),
            pid=os.getpid(),
            task_types=tuple(sorted(self.app.tasks)),
        )

    def gossip_node(self) -> GossipNode | None:
        """The gossip node ``config.gossip`` asks for (None: rivals come from the store). Its
        keys: ``config.gossip_keys``, else ``CONTEND_GOSSIP_KEY`` (comma-separated)."""
        cfg = self.config
        if not cfg.gossip:
            return None
        keys = cfg.gossip_keys or tuple(
            k.strip() for k in os.environ.get(GOSSIP_KEY_ENV, "").split(",") if k.strip()
        )
        return GossipNode(
            self.name,
            bind=cfg.gossip_bind,
            seeds=cfg.gossip,
            keys=keys,
            timing=cfg.gossip_timing,
            monotonic=self.clock.monotonic,
        )

    async def _start_gossip(self, gossip: GossipNode) -> None:
        """Join the gossip cluster once the store has this expert's session: the name is then
        known to be this expert's alone. A summary too large to publish is refused here."""
        gossip.publish(summary(self.info(), self.load, self._metrics()))
        await gossip.start()

    def _publish(self, metrics: dict[str, Any]) -> None:
        gossip = self.parts.gossip if self.parts is not None else None
        if gossip is None:
            return
        try:
            gossip.publish(summary(self.info(), self.load, metrics))
        except ContendError as exc:  # checked at start; only a load of many digits gets here
            log.warning("expert %s: gossip summary not published: %s", self.name, exc)

    async def run(self) -> None:
        store = await self.app.store()
        self.parts = p = _Parts(self, store)
        session = await p.keeper.open()  # raises ExpertConflict when the name is live elsewhere
        if p.gossip is not None:
            try:
                await self._start_gossip(p.gossip)
            except BaseException:
                await p.gossip.close()
                await p.keeper.close()
                raise
        if self._stopping.is_set():
            p.keeper.wind_down()
        await p.housekeeper.refresh_cluster(session)
        self.started.set()
        log.info(
            "expert %s started: store=%s queues=%s concurrency=%d lease=%.1fs",
            self.name,
            shown_url(store.url),
            ",".join(self.queues),
            self.config.concurrency,
            self.config.lease_ttl,
        )
        p.keeper.start()
        p.committer.start()
        housekeeping = asyncio.create_task(p.housekeeper.run(), name="contend-housekeeping")
        loops = [housekeeping]
        if self.config.periodic and self.app.schedules:
            loops.append(asyncio.create_task(p.ticker.run(), name="contend-ticker"))
        if p.dispatcher is not None:
            loops.append(asyncio.create_task(p.dispatcher.run(), name="contend-dispatcher"))
        try:
            await p.claimer.run()
            left = await p.executor.drain(lambda: self.config.grace)
            unstarted = p.claimer.prefetched.take() + p.claimer.take_ready()
            await self._release([r.claimed for r in left] + unstarted)
        finally:
            await p.committer.close()
            for loop in loops:
                loop.cancel()
            for result in await asyncio.gather(*loops, return_exceptions=True):
                if isinstance(result, Exception):
                    log.error("expert %s: a background loop crashed: %r", self.name, result)
            if p.gossip is not None:
                await p.gossip.close()  # leave: rivals hear it at once
            await p.keeper.close()  # stop renewing, then release the session
            p.executor.shutdown()
            stuck = await settle_strays(self.clock, STRAYS_WAIT)
            if stuck:
                log.warning("expert %s: %d store call(s) given up on still run", self.name, stuck)
            log.info(
                "expert %s stopped: done=%d failed=%d fenced_out=%d",
                self.name,
                self.stats.tasks_done,
                self.stats.tasks_failed,
                self.stats.fenced_out,
            )
        if self.error is not None:
            raise self.error

    # -- wiring between the parts ----------------------------------------------------------
    def _wake_claimer(self) -> None:
        if self.parts is not None:
            self.parts.claimer.wake()

    def _metrics(self) -> dict[str, Any]:
        s = self.stats
        metrics = self.competition.metrics(s.claim_attempts, s.claims_won)
        metrics["prefetched"] = len(self.parts.claimer.prefetched) if self.parts else 0
        metrics["ready"] = len(self.parts.claimer.ready) if self.parts else 0
        metrics["stolen"] = s.stolen
        took = self.parts.claimer.claim_seconds if self.parts else None
        if took is not None:  # a claim's round trip, a moving average (a far zone's is longer)
            metrics["claim_ms"] = round(took * 1000, 3)
        return metrics

    def _beat(self) -> Heartbeat:
        s = self.stats
        metrics = self._metrics()
        self._publish(metrics)
        return Heartbeat(self.load, s.claim_attempts, s.claims_won, s.tasks_done, metrics)

    def _renewed(self, session: Session, held: Mapping[str, int], sent: float) -> None:
        """The store said what this expert holds, as of a renewal sent at *sent*: stop what is
        no longer ours, forget stolen prefetches, and let housekeeping run (it releases claims
        nobody here knows of). A claim answered after *sent* may not be in that answer (on a
        store with concurrent connections the renewal can read before the claim commits): it
        is judged by the next renewal."""
        assert self.parts is not None
        p = self.parts
        p.executor.retain(held, sent)
        p.claimer.prefetched.retain(held, sent)
        p.claimer.retain_ready(held, sent)
        known = set(p.executor.runs) | {c.id for c in p.claimer.prefetched}
        known |= {c.id for c, _ in p.claimer.ready}
        p.housekeeper.after_renewal(session, held, known | p.committer.pending_ids())

    def _fatal(self, exc: ContendError) -> None:
        """The store can no longer be used (its schema is gone): stop, and say why."""
        self.error = exc
        self.config.grace = 0
        self.stop()

    def _lost(self, session: Session) -> None:
        """Seed 002: release everything held at once and commit nothing of it."""
        assert self.parts is not None
        p = self.parts
        running = p.executor.abandon_session(session, "the lease was lost")
        dropped = p.committer.drop(session)
        p.claimer.prefetched.take()
        running += len(p.claimer.take_ready())  # claimed ahead under it: never started
        self.hooks.on_lease_lost(self.name, session.reason or "", running, dropped)

    async def _release(self, unfinished: list[Claimed]) -> None:
        """Give back what was claimed but will not be finished, for others to claim at once."""
        if not unfinished:
            return
        assert self.parts is not None
        keeper = self.parts.keeper
        session = keeper.session
        if session is None or not session.safe():
            return  # their leases lapse with the session's
        items = [(c.id, c.fence) for c in unfinished]
        try:
            res = await session.call("a release", lambda: keeper.store.release(self.name, items))
            n = sum(1 for r in res if r is None)
            log.info("expert %s released %d unfinished task(s) for others", self.name, n)
        except ContendError as exc:
            log.warning("expert %s: release failed (leases will lapse instead): %s", self.name, exc)
