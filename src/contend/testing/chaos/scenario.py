"""One chaos scenario's run: a store, expert processes, the tasks submitted, the faults
injected, and at the end the verdict (:mod:`contend.testing.chaos.verdict`).

A fault family (one module each: ``kills``, ``store``, ``network``, ``sqlite``, ``clock``,
``load``) writes a scenario as ``async def run(run: Run) -> None``: it starts experts, submits
work, injects faults with :meth:`Run.fault` (which records when, and whom they hit) and waits
with :meth:`Run.until`; the runner then checks everything the scenario left behind.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from contend.domain.task import TaskSpec, TaskState
from contend.errors import ContendError
from contend.store.port import Store
from contend.store.registry import open_store
from contend.testing.chaos.effects import Effects
from contend.testing.chaos.netns import Link
from contend.testing.chaos.procs import Experts, Proc
from contend.testing.chaos.servers import Backend
from contend.testing.chaos.workload import app as workload

T = TypeVar("T")


@dataclass
class Fault:
    """One fault injected: what, when (this host's monotonic and wall clocks) and whom it hit
    (None: every expert, as a store fault does). ``interrupts``: its runs are expected to stop
    (a kill, a pause or a cut past the lease); otherwise every run in flight is measured."""

    kind: str
    at: float
    wall: float
    experts: tuple[str, ...] | None
    interrupts: bool = True
    healed: float | None = None


@dataclass(frozen=True)
class Size:
    """How big a scenario is: the short mode in CI, the full one for ``make chaos``."""

    short: bool
    tasks: int
    experts: int
    rounds: int  # faults of the scenario's kind, one after another

    def pick(self, short: float, full: float) -> float:
        return short if self.short else full


@dataclass
class Run:
    backend: Backend
    workdir: Path
    size: Size
    lease: float = 2.0
    concurrency: int = 8
    expected: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (seed, steps)
    #: tasks submitted by ``contend submit --batch`` processes, by seed (their ids are made
    #: there): :meth:`adopt` finds them in the store
    batched: dict[int, int] = field(default_factory=dict)  # seed -> steps
    faults: list[Fault] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # a scenario's own failed checks
    notes: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(12))
    store: Store | None = None
    link: Link | None = None  # the network namespace of the experts cut off, if any
    experts: Experts = field(init=False)
    effects: Path = field(init=False)
    deadline_scale: float = 1.0

    def __post_init__(self) -> None:
        self.effects = self.workdir / "effects"
        self.effects.mkdir(parents=True, exist_ok=True)
        self.experts = Experts(
            self.backend.url, self.workdir, self.effects, self.lease, self.concurrency
        )

    @property
    def heartbeat(self) -> float:
        return self.lease / 3

    async def open(self) -> Store:
        if self.store is None:
            self.store = await open_store(self.backend.url)
        return self.store

    async def close(self) -> None:
        if self.store is not None:
            store, self.store = self.store, None
            try:
                await asyncio.wait_for(store.close(), 20)
            except (ContendError, TimeoutError, OSError):
                pass

    # -- work ------------------------------------------------------------------------------
    def specs(
        self, n: int, *, steps: int = 5, step_time: float = 0.02, every: int = 1
    ) -> list[TaskSpec]:
        """*n* ``step`` tasks with fresh seeds, remembered for the verdict."""
        specs = []
        for _ in range(n):
            seed = self.rng.randrange(1, 2**40)
            spec = workload.build_spec("step", [seed, steps, step_time, every])
            self.expected[spec.id] = (seed, steps)
            specs.append(spec)
        return specs

    async def submit(
        self, n: int, *, steps: int = 5, step_time: float = 0.02, every: int = 1
    ) -> list[str]:
        return await self.submit_specs(self.specs(n, steps=steps, step_time=step_time, every=every))

    def batch_file(
        self, name: str, n: int, *, steps: int = 5, step_time: float = 0.0, every: int = 1
    ) -> Path:
        """A batch file of *n* ``step`` tasks with fresh seeds, for ``contend submit --batch``."""
        path = self.workdir / f"{name}.jsonl"
        with path.open("w") as out:
            for _ in range(n):
                seed = self.rng.randrange(1, 2**40)
                self.batched[seed] = steps
                out.write(json.dumps({"args": [seed, steps, step_time, every]}) + "\n")
        return path

    async def adopt(self) -> None:
        """Expect the batched tasks under the ids the store gave them: each seed must be
        there exactly once (a resumed batch adds no duplicate, a killed one loses no line)."""
        store = await self.open()
        limit = len(self.expected) + len(self.batched) + 1000
        seen: dict[int, int] = {}
        for task in await store.list_tasks(limit=limit):
            seed = task.args[0] if task.args else None
            if isinstance(seed, int) and seed in self.batched:
                seen[seed] = seen.get(seed, 0) + 1
                self.expected[task.id] = (seed, self.batched[seed])
        twice = [s for s, n in seen.items() if n > 1]
        absent = [s for s in self.batched if s not in seen]
        if twice:
            self.problems.append(f"{len(twice)} batch line(s) stored more than once")
        if absent:
            self.problems.append(f"{len(absent)} batch line(s) never stored, e.g. {absent[:3]}")

    async def submit_specs(self, specs: list[TaskSpec]) -> list[str]:
        store = await self.open()
        for start in range(0, len(specs), 500):
            await store.submit(specs[start : start + 500])
        return [s.id for s in specs]

    # -- faults ----------------------------------------------------------------------------
    def fault(
        self, kind: str, experts: tuple[str, ...] | None, *, interrupts: bool = True
    ) -> Fault:
        f = Fault(kind, time.monotonic(), time.time(), experts, interrupts)
        self.faults.append(f)
        return f

    def heal(self, fault: Fault) -> None:
        fault.healed = time.monotonic()

    def check_stopped_in_time(self, fault: Fault) -> None:
        """Every run the (hang) *fault* caught took its last step within lease + one
        heartbeat of it (DESIGN I4, also when the store hangs)."""
        bound = self.lease + self.heartbeat
        effects = Effects.read(self.effects)
        lates = [(r.last_effect - fault.at, r) for r in effects.running_at(fault.at, fault.experts)]
        for late, r in lates:
            if late > bound:
                self.problems.append(
                    f"{r.expert} ran task {r.task} {late:.2f}s into the {fault.kind} "
                    f"(bound {bound:.2f}s)"
                )
        if lates:
            self.notes.append(
                f"runs caught by the {fault.kind} took their last step at most "
                f"{max(x for x, _ in lates):.2f}s into it (bound: lease + heartbeat = {bound:.2f}s)"
            )

    # -- waiting ---------------------------------------------------------------------------
    async def until(
        self,
        check: Callable[[], Awaitable[bool]],
        timeout: float,
        what: str,
        *,
        every: float = 0.1,
    ) -> float:
        """Poll *check* until it holds (store errors count as "not yet"); returns the seconds
        it took. Raises AssertionError after *timeout* or when an expert died on its own."""
        began = time.monotonic()
        deadline = began + timeout * self.deadline_scale
        while True:
            died = self.experts.died()
            if died:
                raise AssertionError("an expert died on its own: " + "; ".join(died))
            try:
                if await asyncio.wait_for(check(), 30):
                    return time.monotonic() - began
            except (ContendError, TimeoutError, OSError):
                pass  # the store is down or out of reach: that may be the fault
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            await asyncio.sleep(every)

    async def retrying(self, read: Callable[[], Awaitable[T]], timeout: float, what: str) -> T:
        """*read* once it stops failing (the store restarting, out of reach)."""
        got: list[T] = []

        async def once() -> bool:
            got.append(await read())
            return True

        await self.until(once, timeout, what)
        return got[-1]

    async def experts_up(self, timeout: float = 60) -> None:
        """Until every live expert has started (registered, and said so in its log): the
        faults are meant for running experts. (An expert that cannot reach its store when it
        starts exits; see the runner's notes.)"""

        async def up() -> bool:
            return all("started:" in p.text() for p in self.experts.live())

        await self.until(up, timeout, "every expert to start", every=0.1)

    async def busy_expert(self, timeout: float = 60) -> Proc:
        """A live expert in the middle of a task (so that killing it interrupts work)."""
        found: list[Proc] = []

        async def busy() -> bool:
            running = {r.expert for r in Effects.read(self.effects).running_at(time.monotonic())}
            found[:] = [p for p in self.experts.live() if p.name in running]
            return bool(found)

        await self.until(busy, timeout, "an expert to be running a task", every=0.05)
        return self.rng.choice(found)

    async def counts(self) -> dict[str, int]:
        stats = await (await self.open()).stats()
        total: dict[str, int] = {}
        for by_state in stats.counts.values():
            for state, n in by_state.items():
                total[state] = total.get(state, 0) + n
        return total

    async def succeeded(self) -> int:
        return (await self.counts()).get(str(TaskState.SUCCEEDED), 0)

    async def until_succeeded(self, n: int, timeout: float, what: str = "") -> float:
        async def enough() -> bool:
            return await self.succeeded() >= n

        return await self.until(enough, timeout, what or f"{n} tasks to succeed", every=0.2)

    async def until_all_done(self, timeout: float) -> float:
        """Until every task is terminal; the verdict then says whether it is right."""
        total = len(self.expected)

        async def finished() -> bool:
            counts = await self.counts()
            return sum(n for s, n in counts.items() if TaskState(s).terminal) >= total

        return await self.until(finished, timeout, f"all {total} tasks to end", every=0.25)

    async def sleep(self, seconds: float) -> None:
        """Let the run go on for *seconds* (between faults; never to wait for a condition)."""
        await asyncio.sleep(seconds)
