"""A deterministic discrete-event simulation of task placement through a real MemoryStore.

Simulated experts register, peek, claim (``task_ids=…``) and complete through
:class:`~contend.store.memory.MemoryStore`, the same claim/complete/fence path the runtime
uses, while a :class:`~contend.testing.clock.FakeClock` carries virtual time. Nothing sleeps
and nothing reads the wall clock (except to report how long the simulation itself took); one
seed always gives the same run.

Strategies:

``fifo``
    A plain work queue: a free expert claims the oldest task it can run (the longest-idle expert
    first when work arrives).
``race`` / ``race-nojitter``
    What :class:`~contend.runtime.expert.Expert` does: a free expert peeks the best claimable
    tasks, scores each with :func:`~contend.domain.scoring.speed_fitness` relative to the best
    rival (rivals' load as last heard, refreshed every heartbeat), waits the race delay of the
    best one and claims every task about as good; a claim that comes back short is a lost race.
``auction``
    Every ``window`` the free experts bid their fitness on the tasks they see; each task goes
    to its top bidder, which then claims it.
``greedy``
    A central scheduler that knows every arrival and size in advance assigns each task, in
    arrival order, to the expert slot that would finish it earliest. A yardstick, not a design
    anyone can deploy as is.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from contend.domain.scoring import (
    ExpertView,
    Fitness,
    TaskView,
    race_delay,
    speed_fitness,
)
from contend.domain.task import Capabilities, Requirements, TaskSpec
from contend.sim.scenario import Job, Scenario, SimExpert
from contend.store.memory import MemoryStore
from contend.store.port import Completion, ExpertInfo
from contend.testing.clock import FakeClock

STRATEGIES = ("fifo", "race", "race-nojitter", "auction", "greedy")

QUEUES = ("default",)
LEASE = 1e9  # virtual seconds: leases never lapse in a simulation without failures

T = TypeVar("T")

# Event kinds, in the order they are handled at one instant.
_ARRIVE, _FINISH, _START, _TRY, _AUCTION = range(5)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of the competing strategies."""

    window: float = 0.05  # race window and auction bidding window, seconds
    jitter: float = 0.1
    depth: int | None = None  # tasks a free expert looks at; None: 2 × free slots, as Expert
    heartbeat: float = 5.0  # how often an expert hears its rivals' load
    # Expert asks for exactly as many ids as it has free slots, so a race lost on one id is a
    # slot left idle; with spares it names every candidate about as fit and the store hands
    # it the first ones still pending.
    spares: bool = False
    # Expert breaks ties between equally good candidates by peek order, so equally fit experts
    # (a perfect fit always waits 0, jitter or not) all go for the same task; with
    # shuffle_ties each breaks them at random.
    shuffle_ties: bool = False
    seed: int = 1


@dataclass(slots=True)
class Result:
    """What one strategy achieved on one scenario."""

    strategy: str
    scenario: str
    experts: int
    slots: int
    tasks: int
    makespan: float  # first arrival to last completion, virtual seconds
    mean_completion: float  # mean of (completion - arrival), virtual seconds
    p95_completion: float
    claim_calls: int  # calls to store.claim
    claim_attempts: int  # tasks asked for: min(limit, ids named); a fifo call: what it got, or 1
    claims_won: int
    lost_races: int  # slots asked for that came back empty: someone else claimed first
    bids: int
    events: int
    wall_seconds: float  # real time the simulation took (not virtual time)
    cpu_seconds: float  # CPU time of this process for it: steadier on a shared machine

    @property
    def claims_per_task(self) -> float:
        return self.claim_attempts / self.tasks if self.tasks else 0.0

    @property
    def lost_share(self) -> float:
        return self.lost_races / self.claim_attempts if self.claim_attempts else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "scenario": self.scenario,
            "experts": self.experts,
            "slots": self.slots,
            "tasks": self.tasks,
            "makespan": round(self.makespan, 4),
            "mean_completion": round(self.mean_completion, 4),
            "p95_completion": round(self.p95_completion, 4),
            "claim_calls": self.claim_calls,
            "claim_attempts": self.claim_attempts,
            "claims_won": self.claims_won,
            "lost_races": self.lost_races,
            "claims_per_task": round(self.claims_per_task, 4),
            "bids": self.bids,
            "events": self.events,
            "wall_seconds": round(self.wall_seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
        }


def simulate(scenario: Scenario, strategy: str, config: SimConfig | None = None) -> Result:
    """Run *scenario* under *strategy* to the last completion."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; pick one of {', '.join(STRATEGIES)}")
    config = config or SimConfig()
    if strategy == "race-nojitter":
        config = replace(config, jitter=0.0)
    return _Sim(scenario, strategy, config).run()


def _now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a store coroutine that never suspends (the memory store's do not) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("the memory store suspended inside a simulation step")


@dataclass(eq=False, slots=True)
class _Expert:
    index: int
    spec: SimExpert
    caps: Capabilities
    session: str = ""
    busy: int = 0
    trying: bool = False  # a race claim is scheduled
    fit: dict[tuple[str, int], float] = field(default_factory=dict)  # (kind, load) -> fitness

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def free(self) -> int:
        return self.spec.slots - self.busy


class _Sim:
    def __init__(self, scenario: Scenario, strategy: str, config: SimConfig) -> None:
        self.sc = scenario
        self.strategy = strategy
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.clock = FakeClock(0.0)
        self.store = MemoryStore("memory://sim", clock=self.clock)
        self.experts = [
            _Expert(i, e, Capabilities(frozenset({"gpu"}) if e.gpu else frozenset()))
            for i, e in enumerate(scenario.experts)
        ]
        self.by_name = {e.name: e for e in scenario.experts}
        fastest = max([1.0, *(s for e in scenario.experts for s in e.speed.values())])
        self.fitness: Fitness = speed_fitness(self._speed, fastest)
        self.jobs = {j.id: j for j in scenario.jobs}
        self.templates = {
            k.name: TaskView("", k.name, QUEUES[0], 0, _requirements(k.gpu), 0.0)
            for k in scenario.kinds.values()
        }
        self.heap: list[tuple[float, int, int, int, tuple[str, ...]]] = []
        self.seq = 0
        self.batches: list[list[Job]] = []
        self.fences: dict[str, int] = {}
        self.idle: dict[_Expert, None] = {}  # waiting for new work, longest idle first
        self.bidders: dict[_Expert, None] = {}
        self.auction_due = False
        self.best: dict[str, float] = {}
        self.best_at = -1e300
        self.pending = 0
        self.finish: dict[str, float] = {}
        self.calls = self.attempts = self.won = self.lost = self.bids = self.events = 0

    # -- plumbing --------------------------------------------------------------------------
    def _speed(self, expert: ExpertView, task: TaskView) -> float:
        return self.by_name[expert.name].speed_on(task.type)

    def _push(self, at: float, kind: int, who: int, ids: tuple[str, ...] = ()) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, kind, self.seq, who, ids))

    def run(self) -> Result:
        started, cpu = time.perf_counter(), time.process_time()
        for e in self.experts:
            info = ExpertInfo(e.name, e.caps, QUEUES, e.spec.slots)
            e.session = _now(self.store.register_expert(info, LEASE))
            self.idle[e] = None  # every expert starts idle, waiting for work
        at: float | None = None
        for job in sorted(self.sc.jobs, key=lambda j: (j.arrival, j.id)):
            if job.arrival != at:
                self.batches.append([])
                self._push(job.arrival, _ARRIVE, len(self.batches) - 1)
                at = job.arrival
            self.batches[-1].append(job)
        if self.strategy == "greedy":
            self._plan()
        while self.heap:
            at, kind, _, who, ids = heapq.heappop(self.heap)
            if at > self.clock.value:
                self.clock.advance(at - self.clock.value)
            self.events += 1
            if kind == _ARRIVE:
                self._arrive(self.batches[who])
            elif kind == _FINISH:
                self._finish(self.experts[who], ids[0])
            elif kind == _START:
                self._claim(self.experts[who], 1, ids)
            elif kind == _TRY:
                self._try(self.experts[who], ids)
            else:
                self._auction()
        if len(self.finish) != len(self.jobs):
            raise RuntimeError(
                f"{len(self.jobs) - len(self.finish)} task(s) never ran: no expert can run them"
            )
        return self._result(time.perf_counter() - started, time.process_time() - cpu)

    def _result(self, wall: float, cpu: float) -> Result:
        waits = sorted(self.finish[j.id] - j.arrival for j in self.sc.jobs)
        n = len(waits)
        start = min((j.arrival for j in self.sc.jobs), default=0.0)
        return Result(
            strategy=self.strategy,
            scenario=self.sc.name,
            experts=len(self.experts),
            slots=self.sc.slots,
            tasks=n,
            makespan=max(self.finish.values(), default=start) - start,
            mean_completion=sum(waits) / n if n else 0.0,
            p95_completion=waits[min(n - 1, int(0.95 * n))] if n else 0.0,
            claim_calls=self.calls,
            claim_attempts=self.attempts,
            claims_won=self.won,
            lost_races=self.lost,
            bids=self.bids,
            events=self.events,
            wall_seconds=wall,
            cpu_seconds=cpu,
        )

    def _arrive(self, jobs: list[Job]) -> None:
        specs = [
            replace(
                TaskSpec.build(j.kind, requirements=_requirements(self.sc.kinds[j.kind].gpu)),
                id=j.id,
            )
            for j in jobs
        ]
        _now(self.store.submit(specs))
        self.pending += len(specs)
        if self.strategy == "greedy":
            return
        gpu_only = all(self.sc.kinds[j.kind].gpu for j in jobs)
        for e in list(self.idle):
            if self.pending <= 0:
                break
            if gpu_only and not e.spec.gpu:
                continue
            del self.idle[e]
            self._wake(e)

    def _claim(self, e: _Expert, limit: int, ids: Sequence[str] | None) -> int:
        """Claim through the store and start what came back; returns how many."""
        got = _now(
            self.store.claim(
                e.name,
                e.session,
                QUEUES,
                e.caps,
                limit=limit,
                lease_ttl=LEASE,
                task_ids=ids,
            )
        )
        self.calls += 1
        wanted = max(1, len(got)) if ids is None else min(limit, len(ids))
        self.attempts += wanted
        self.won += len(got)
        if ids is not None:
            self.lost += wanted - len(got)
        now = self.clock.value
        for c in got:
            e.busy += 1
            self.pending -= 1
            self.fences[c.id] = c.fence
            self._push(now + self.sc.duration(e.spec, self.jobs[c.id]), _FINISH, e.index, (c.id,))
        return len(got)

    def _finish(self, e: _Expert, tid: str) -> None:
        refused = _now(self.store.complete(e.name, [Completion(tid, self.fences.pop(tid), "null")]))
        if refused[0] is not None:
            raise refused[0]
        e.busy -= 1
        self.finish[tid] = self.clock.value
        if self.strategy != "greedy":
            self._wake(e)

    def _wake(self, e: _Expert) -> None:
        """*e* may have a free slot and there may be work: act as the strategy says."""
        if e.free <= 0:
            return
        if self.strategy == "fifo":
            free = e.free
            if self.pending <= 0 or self._claim(e, free, None) < free:
                self.idle[e] = None
        elif self.strategy == "auction":
            self.bidders[e] = None
            if not self.auction_due:
                self.auction_due = True
                self._push(self.clock.value + self.cfg.window, _AUCTION, -1)
        else:
            self._race(e)

    # -- race ------------------------------------------------------------------------------
    def _fit(self, e: _Expert, kind: str) -> float:
        key = (kind, e.busy)
        fit = e.fit.get(key)
        if fit is None:
            view = ExpertView(e.name, e.caps, e.spec.slots, e.busy)
            fit = e.fit[key] = self.fitness(view, self.templates[kind])
        return fit

    def _rivals_best(self) -> dict[str, float]:
        """Each kind's best fitness among all experts, at their load as of the last heartbeat."""
        now = self.clock.value
        if now - self.best_at >= self.cfg.heartbeat:
            self.best_at = now
            self.best = {k: max(self._fit(e, k) for e in self.experts) for k in self.templates}
        return self.best

    def _depth(self, e: _Expert) -> int:
        return self.cfg.depth or 2 * e.free

    def _race(self, e: _Expert) -> None:
        if e.trying:
            return
        views = _now(self.store.peek(QUEUES, e.caps, self._depth(e)))
        if not views:
            self.idle[e] = None
            return
        best = self._rivals_best()
        delays: list[tuple[float, float]] = []
        for n, v in enumerate(views):
            mine = self._fit(e, v.type)
            top = max(mine, best[v.type])
            rel = mine / top if top > 0 else 0.0
            delay = race_delay(self.cfg.window, rel, self.cfg.jitter, self.rng.random)
            delays.append((delay, self.rng.random() if self.cfg.shuffle_ties else n))
        order = sorted(range(len(views)), key=delays.__getitem__)
        first = delays[order[0]][0]
        slack = first + self.cfg.window * 0.1
        ids = tuple(views[n].id for n in order if delays[n][0] <= slack)
        if not self.cfg.spares:
            ids = ids[: e.free]
        e.trying = True
        self._push(self.clock.value + first, _TRY, e.index, ids)

    def _try(self, e: _Expert, ids: tuple[str, ...]) -> None:
        e.trying = False
        self._claim(e, max(1, e.free), ids)
        self._wake(e)

    # -- auction ---------------------------------------------------------------------------
    def _auction(self) -> None:
        """Close one bidding round. Auctions are open for the oldest tasks the bidders can
        claim: for each kind of bidder (its capabilities), as many as a racing expert would look
        at and at least twice those bidders' free slots. Every
        free expert bids its fitness; the highest bids are served first, each with the oldest
        open tasks it bid on, up to its free slots. A bid depends only on the task's kind here,
        so an expert bids once per kind and the bid stands for every open task of that kind."""
        self.auction_due = False
        bidders = [e for e in self.bidders if e.free > 0]
        self.bidders.clear()
        if not bidders:
            return
        slots: dict[frozenset[str], int] = {}  # simulated capabilities are tags only
        for e in bidders:
            slots[e.caps.tags] = slots.get(e.caps.tags, 0) + e.free
        seen: dict[str, str] = {}  # id -> kind
        sees: dict[frozenset[str], bool] = {}  # is there anything these bidders could claim?
        for tags, free in slots.items():
            limit = max(self.cfg.depth or 0, 2 * free)
            views = _now(self.store.peek(QUEUES, Capabilities(tags), limit))
            sees[tags] = bool(views)
            for v in views:
                seen[v.id] = v.type
        open_tasks: dict[str, list[str]] = {}
        for tid in sorted(seen, key=self._order):
            open_tasks.setdefault(seen[tid], []).append(tid)
        bids: list[tuple[float, float, int, str]] = []
        for e in bidders:
            for kind in open_tasks:
                if e.caps.satisfies(self.templates[kind].requirements):
                    bids.append((-self._fit(e, kind), self.rng.random(), e.index, kind))
        self.bids += len(bids)
        bids.sort()
        taken = dict.fromkeys(open_tasks, 0)
        wins: dict[int, list[str]] = {e.index: [] for e in bidders}
        for _, _, who, kind in bids:
            room = self.experts[who].free - len(wins[who])
            ids = open_tasks[kind][taken[kind] : taken[kind] + room]
            taken[kind] += len(ids)
            wins[who] += ids
        for who, tids in wins.items():
            e = self.experts[who]
            if tids:
                self._claim(e, len(tids), tids)
            elif not sees[e.caps.tags]:
                self.idle[e] = None  # nothing it can run: wait for new work
                continue
            if e.free > 0:
                self._wake(e)  # outbid, or slots left: bid in the next round

    def _order(self, tid: str) -> tuple[float, str]:
        """Claim order of a pending task (every simulated task has priority 0)."""
        return self.jobs[tid].arrival, tid

    # -- greedy ----------------------------------------------------------------------------
    def _plan(self) -> None:
        """Earliest finish time, in arrival order, with full knowledge; one heap of slot free
        times per expert profile keeps it O(profiles × log slots) per task."""
        profiles: dict[object, list[tuple[float, int, int]]] = {}
        for e in self.experts:
            heap = profiles.setdefault(e.spec.profile, [])
            for slot in range(e.spec.slots):
                heapq.heappush(heap, (0.0, e.index, slot))
        for job in sorted(self.sc.jobs, key=lambda j: (j.arrival, j.id)):
            choice: tuple[float, float, int, int] | None = None  # finish, start, expert, slot
            for heap in profiles.values():
                free_at, who, _ = heap[0]
                spec = self.experts[who].spec
                if not self.sc.can_run(spec, job.kind):
                    continue
                start = max(free_at, job.arrival)
                finish = start + self.sc.duration(spec, job)
                if choice is None or (finish, who) < (choice[0], choice[2]):
                    choice = (finish, start, who, id(heap))
            if choice is None:
                continue  # nobody can run it: run() reports it
            finish, start, who, _ = choice
            heap = profiles[self.experts[who].spec.profile]
            _, _, slot = heapq.heappop(heap)
            heapq.heappush(heap, (finish, who, slot))
            self._push(start, _START, who, (job.id,))


_GPU = Requirements(frozenset({"gpu"}))
_NONE = Requirements()


def _requirements(gpu: bool) -> Requirements:
    return _GPU if gpu else _NONE
