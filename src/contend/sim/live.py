"""Placement by the real :class:`~contend.runtime.expert.Expert`, in virtual time.

Each simulated expert is an ``Expert`` — its competition, fitness, race delays, auctions,
claim loop, executor, committer and heartbeats, unchanged — on one event loop against one
:class:`~contend.store.memory.MemoryStore`, with one :class:`~contend.testing.FakeClock` as
the store's clock and every expert's. A task's body sleeps its duration on that clock: the
kind's base × the task's size ÷ the speed of the expert running it. Experts score tasks with
:func:`~contend.domain.scoring.speed_fitness` (the shipped ``default_fitness`` × speed on the
kind ÷ the fastest speed) and declare the kinds they are faster at as their specialties, as
``contend expert --specialty`` does. Whenever every expert waits, the clock jumps to the next deadline, so
virtual seconds cost nothing; the global random generator is seeded, so one seed gives one run.
The work arrives once the cluster runs: 1.5 heartbeats in, when every expert has heard of its
rivals (experts started at the same instant as a batch would not yet know each other); times
are measured from there.

Strategies: ``race`` (task types in mode ``race``), ``race-nojitter`` (the same with jitter
0) and ``auction`` (every type in mode ``auction``; bidding window and grace both the race
window).
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from contend.domain.scoring import ExpertView, TaskView, by_shape, speed_fitness
from contend.domain.task import Capabilities, Requirements, TaskSpec
from contend.runtime.app import App
from contend.runtime.context import TaskContext
from contend.runtime.expert import Expert
from contend.runtime.hooks import Hook, Outcome
from contend.sim.result import Result, SimConfig, check_runnable, summarise
from contend.sim.scenario import Job, Scenario
from contend.store.memory import MemoryStore
from contend.store.port import Auction, Claimed
from contend.testing.clock import FakeClock

#: The strategies run by real experts.
LIVE = ("race", "race-nojitter", "auction")

#: Seconds: a simulation never runs long enough for a lease to matter (the longest allowed).
LEASE = 86_400.0
#: The experts' longest idle wait: long, since every wake-up that matters (a store change, a
#: task falling due, an auction moment) wakes them by itself.
IDLE_WAIT = 3_600.0
#: Work starts this many heartbeats into the run, once every expert has heard of its rivals.
WARM_UP = 1.5
#: Give up when virtual time passes the last arrival by this much without every task done.
HORIZON = 1e6
#: The cycle collector is off during a run but for one collection every this many steps of
#: the clock (see simulate_live).
COLLECT_EVERY = 5_000


class VirtualStore(MemoryStore):
    """The memory store, counting claims and bids, with its change wait unbounded in real
    time: each expert bounds that wait on the virtual clock itself, so no real-time timer is
    left to fire early when the simulation runs slower than its virtual time."""

    claims = 0
    bids = 0

    async def wait_for_change(self, timeout: float) -> None:
        await super().wait_for_change(math.inf)

    async def wait_for_work(self, timeout: float) -> None:
        await super().wait_for_work(math.inf)

    async def claim(self, expert: str, session: str, *args: Any, **kwargs: Any) -> list[Claimed]:
        self.claims += 1
        return await super().claim(expert, session, *args, **kwargs)

    async def bid(self, expert: str, session: str, *args: Any, **kwargs: Any) -> Auction:
        self.bids += 1
        return await super().bid(expert, session, *args, **kwargs)


class _Finishes(Hook):
    """When each task's completion was committed, in the scenario's time (virtual time less
    the warm-up), and the process's CPU time at the first arrival and the last completion."""

    def __init__(self, clock: FakeClock, start: float, tasks: int) -> None:
        self.clock = clock
        self.start = start
        self.tasks = tasks
        self.at: dict[str, float] = {}
        self.cpu_first = self.cpu_last = 0.0

    def on_committed(self, expert: str, outcome: Outcome) -> None:
        self.at[outcome.task_id] = self.clock() - self.start
        if len(self.at) == self.tasks:
            self.cpu_last = time.process_time()


def _app(sc: Scenario, store: MemoryStore, clock: FakeClock, mode: str) -> App:
    app = App("memory://sim", store_factory=lambda url: store)
    by_name = {e.name: e for e in sc.experts}
    jobs = {j.id: j for j in sc.jobs}

    async def work(ctx: TaskContext) -> None:
        await clock.sleep(sc.duration(by_name[ctx.expert], jobs[ctx.task_id]))

    for kind in sc.kinds.values():
        requirements = ["gpu"] if kind.gpu else None
        app.task(name=kind.name, requirements=requirements, mode=mode, pass_context=True)(work)
    return app


def _experts(sc: Scenario, app: App, clock: FakeClock, cfg: SimConfig, hook: Hook) -> list[Expert]:
    by_name = {e.name: e for e in sc.experts}
    fastest = max([1.0, *(s for e in sc.experts for s in e.speed.values())])

    @by_shape  # it reads the task's type alone
    def speed(expert: ExpertView, task: TaskView) -> float:
        return by_name[expert.name].speed_on(task.type)

    fitness = speed_fitness(speed, fastest)
    return [
        Expert(
            app,
            name=e.name,
            concurrency=e.slots,
            queues=["default"],
            capabilities=Capabilities(frozenset({"gpu"}) if e.gpu else frozenset()),
            specialties=frozenset(k for k, v in e.speed.items() if v > 1),
            fitness=fitness,
            window=cfg.window,
            jitter=cfg.jitter,
            auction_window=cfg.window,
            auction_grace=max(cfg.window, 0.01),  # must be positive
            heartbeat=cfg.heartbeat,
            lease_ttl=LEASE,
            idle_wait=IDLE_WAIT,
            grace=0.0,
            clock=clock,
            hooks=[hook],
        )
        for e in sc.experts
    ]


def _specs(sc: Scenario, jobs: Sequence[Job]) -> list[TaskSpec]:
    gpu = Requirements(frozenset({"gpu"}))
    return [
        replace(TaskSpec.build(j.kind, requirements=gpu if sc.kinds[j.kind].gpu else None), id=j.id)
        for j in jobs
    ]


async def _arrivals(
    sc: Scenario, store: MemoryStore, clock: FakeClock, finishes: _Finishes
) -> None:
    start = finishes.start
    batches: dict[float, list[Job]] = {}
    for job in sorted(sc.jobs, key=lambda j: (j.arrival, j.id)):
        batches.setdefault(start + job.arrival, []).append(job)
    for at, jobs in batches.items():
        if at > clock():
            await clock.sleep(at - clock())
        if not finishes.cpu_first:
            finishes.cpu_first = time.process_time()
        await store.submit(_specs(sc, jobs))


async def _until(clock: FakeClock, done: Any, limit: float) -> int:
    """Step the clock from deadline to deadline until *done()*; returns the steps taken."""
    steps = 0
    end = clock() + limit
    await clock.settle()
    while not done():
        due = clock.next_deadline()
        if due is None or due > end:
            raise RuntimeError("the simulation stalled: nothing left to wait for")
        clock.advance(due - clock())
        steps += 1
        if steps % COLLECT_EVERY == 0:
            gc.collect()
        await clock.settle()
    return steps


async def _run(
    sc: Scenario, strategy: str, cfg: SimConfig
) -> tuple[dict[str, float], dict[str, int], float]:
    random.seed(cfg.seed)  # race delays, jitter and back-off draw from it
    clock = FakeClock(0.0)
    store = VirtualStore("memory://sim", clock=clock)
    # the cluster runs before work arrives: by then every expert has heard of the others
    start = WARM_UP * cfg.heartbeat
    finishes = _Finishes(clock, start, len(sc.jobs))
    app = _app(sc, store, clock, "auction" if strategy == "auction" else "race")
    experts = _experts(sc, app, clock, cfg, finishes)
    runners = [asyncio.create_task(e.run(), name=f"sim-{e.name}") for e in experts]
    arrivals = asyncio.create_task(_arrivals(sc, store, clock, finishes))
    horizon = start + max((j.arrival for j in sc.jobs), default=0.0) + HORIZON
    try:
        steps = await _until(clock, lambda: len(finishes.at) >= len(sc.jobs), horizon)
    finally:
        for e in experts:
            e.stop()
        await _until(clock, lambda: all(r.done() for r in runners), 600.0)
        await asyncio.gather(*runners, arrivals)
    counts = {
        "claim_calls": store.claims,
        "claim_attempts": sum(e.stats.claim_attempts for e in experts),
        "claims_won": sum(e.stats.claims_won for e in experts),
        "bids": store.bids,
        "events": steps,
    }
    return finishes.at, counts, finishes.cpu_last - finishes.cpu_first


def simulate_live(sc: Scenario, strategy: str, cfg: SimConfig) -> Result:
    """Run *sc* with one real Expert per simulated expert, to the last completion."""
    if strategy not in LIVE:
        raise ValueError(f"real experts run {', '.join(LIVE)}, not {strategy!r}")
    check_runnable(sc)
    started, cpu = time.perf_counter(), time.process_time()
    # Every expert holds a record and a view of every other: at 500 experts the collector
    # walked millions of long-lived objects again and again, a third of the run's CPU time,
    # to find a few hundred objects of cyclic garbage (566 in a 1,000-task batch). It runs
    # every COLLECT_EVERY steps instead.
    enabled = gc.isenabled()
    gc.disable()
    try:
        finish, n, work_cpu = asyncio.run(_run(sc, strategy, cfg))
    finally:
        if enabled:
            gc.enable()
    return summarise(
        sc,
        strategy,
        finish,
        claim_calls=n["claim_calls"],
        claim_attempts=n["claim_attempts"],
        claims_won=n["claims_won"],
        lost_races=n["claim_attempts"] - n["claims_won"],
        bids=n["bids"],
        events=n["events"],
        wall=time.perf_counter() - started,
        cpu=time.process_time() - cpu,
        work_cpu=work_cpu,
    )
