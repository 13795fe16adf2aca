"""Placement simulation in virtual time, through a real MemoryStore.

``race``, ``race-nojitter`` and ``auction`` run the real :class:`~contend.runtime.expert.Expert`
(see :mod:`contend.sim.live`): its competition, fitness, race delays, auctions and claims are
what is measured. The two yardsticks are modelled here as a discrete-event simulation:

``fifo``
    A plain work queue: a free expert claims the oldest task it can run (the longest-idle expert
    first when work arrives), through the store's ``claim``, fences and all.
``greedy``
    A central scheduler that knows every arrival and size in advance assigns each task, in
    arrival order, to the expert slot that would finish it earliest. A yardstick, not a design
    anyone can deploy as is.

Nothing sleeps and nothing reads the wall clock (except to report how long a simulation took);
one seed always gives the same run.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from contend.domain.task import Capabilities, Requirements, TaskSpec
from contend.sim.live import LIVE, simulate_live
from contend.sim.result import Result, SimConfig, check_runnable, summarise
from contend.sim.scenario import Job, Scenario, SimExpert
from contend.store.memory import MemoryStore
from contend.store.port import Completion, ExpertInfo
from contend.testing.clock import FakeClock

#: Every strategy: the real expert's (LIVE) and the two yardsticks.
STRATEGIES = ("fifo", "race", "race-nojitter", "auction", "greedy")
YARDSTICKS = ("fifo", "greedy")

QUEUES = ("default",)
LEASE = 1e9  # virtual seconds: leases never lapse in a simulation without failures

T = TypeVar("T")

# Event kinds, in the order they are handled at one instant.
_ARRIVE, _FINISH, _START = range(3)


def simulate(scenario: Scenario, strategy: str, config: SimConfig | None = None) -> Result:
    """Run *scenario* under *strategy* to the last completion."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; pick one of {', '.join(STRATEGIES)}")
    config = config or SimConfig()
    check_runnable(scenario)
    if strategy in LIVE:
        if strategy == "race-nojitter":
            config = replace(config, jitter=0.0)
        return simulate_live(scenario, strategy, config)
    return _Sim(scenario, strategy).run()


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

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def free(self) -> int:
        return self.spec.slots - self.busy


class _Sim:
    """The yardsticks: fifo (a plain queue) and greedy (an all-knowing planner)."""

    def __init__(self, scenario: Scenario, strategy: str) -> None:
        if strategy not in YARDSTICKS:
            raise ValueError(f"the engine models only {', '.join(YARDSTICKS)}, not {strategy!r}")
        self.sc = scenario
        self.strategy = strategy
        self.clock = FakeClock(0.0)
        self.store = MemoryStore("memory://sim", clock=self.clock)
        self.experts = [
            _Expert(i, e, Capabilities(frozenset({"gpu"}) if e.gpu else frozenset()))
            for i, e in enumerate(scenario.experts)
        ]
        self.jobs = {j.id: j for j in scenario.jobs}
        self.heap: list[tuple[float, int, int, int, tuple[str, ...]]] = []
        self.seq = 0
        self.batches: list[list[Job]] = []
        self.fences: dict[str, int] = {}
        self.idle: dict[_Expert, None] = {}  # waiting for new work, longest idle first
        self.pending = 0
        self.finish: dict[str, float] = {}
        self.calls = self.attempts = self.won = self.events = 0

    # -- plumbing --------------------------------------------------------------------------
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
            else:
                self._claim(self.experts[who], 1, ids)
        return summarise(
            self.sc,
            self.strategy,
            self.finish,
            claim_calls=self.calls,
            claim_attempts=self.attempts,
            claims_won=self.won,
            lost_races=0,
            bids=0,
            events=self.events,
            wall=time.perf_counter() - started,
            cpu=time.process_time() - cpu,
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
        self.attempts += max(1, len(got)) if ids is None else min(limit, len(ids))
        self.won += len(got)
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
        if self.strategy == "fifo":
            self._wake(e)

    def _wake(self, e: _Expert) -> None:
        """*e* may have a free slot and there may be work: a fifo expert claims the oldest."""
        if e.free <= 0:
            return
        free = e.free
        if self.pending <= 0 or self._claim(e, free, None) < free:
            self.idle[e] = None

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
