"""Exactly-once effects under faults: a counter in the store's own database, incremented by
every task in its transaction (``ctx.transaction()``), ends at exactly the number of tasks
while real expert processes are killed with ``kill -9`` and paused with SIGSTOP past their
lease (then SIGCONT), as they run.

The default run counts ``CONTEND_EXACTLY_ONCE_TASKS`` tasks (1,000) per backend; ``make
exactly-once`` runs 10,000. Each run prints its figures on one line (``-s`` shows them).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from contend.domain.task import TaskSpec, TaskState
from contend.store.port import Store
from contend.testing.counters import counter_for
from tests.acceptance.conftest import Experts

TASKS = int(os.environ.get("CONTEND_EXACTLY_ONCE_TASKS", "1000"))
#: The run's own deadline (seconds), within pytest's.
DEADLINE = 120 + TASKS / 10
LEASE = 2.5
EXPERTS = 3
CONCURRENCY = 4
#: Faults, one every GAP seconds after the last one ended while tasks remain, in turn: kill -9
#: of a random expert (a new one replaces it), and SIGSTOP of one for PAUSE leases, then SIGCONT.
GAP = 1.5
PAUSE = 1.5
#: At least this many of each kind in a run, or it ran too fast to show anything.
AT_LEAST = 2
#: What each task spends (seconds, the ``count`` task's ``wait``, ``hold`` and ``hold_after``),
#: so that a run lasts long enough for the faults and they land inside transactions. SQLite
#: holds its write lock for the whole block: the effect comes first, then the wait, so that a
#: fault finds it written and not committed. PostgreSQL locks the counter's row from the
#: increment to the commit: the increment comes last. etcd's transaction is optimistic: the
#: shorter the block, the fewer conflicts on the one counter key.
PACE = {
    "sqlite": (0.05, 0.0, 0.005),
    "postgresql": (0.05, 0.05, 0.0),
    "etcd": (0.1, 0.0, 0.0),
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEADLINE + 180)]


@dataclass
class Chaos:
    experts: Experts
    rng: random.Random
    alive: list[str] = field(default_factory=list)
    kills: int = 0
    pauses: int = 0
    restarts: int = 0
    _next: int = 0

    def start(self) -> None:
        name = f"w{self._next}"
        self._next += 1
        self.experts.start(name, lease=LEASE, concurrency=CONCURRENCY)
        self.alive.append(name)

    def replace_failed_starts(self) -> None:
        """A replacement that never started — it could not reach the store or register within
        its lease, the store kept busy by the faults and the machine loaded: it exits 1 saying
        so — is started again; an expert that exits after it started is left for
        ``Experts.check_alive`` to report."""
        for name in list(self.alive):
            if self.experts.procs[name].poll() == 1 and (
                f"expert {name} started" not in self.experts.log(name)
            ):
                self.experts.killed.add(name)
                self.alive.remove(name)
                self.restarts += 1
                self.start()

    async def strike(self, n: int) -> None:
        victim = self.rng.choice(self.alive)
        if n % 2 == 0:
            self.experts.kill(victim)  # kill -9
            self.alive.remove(victim)
            self.kills += 1
            self.start()
            return
        proc = self.experts.procs[victim]
        proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE * LEASE)  # the fault's length, not a synchronisation
        finally:
            proc.send_signal(signal.SIGCONT)
        self.pauses += 1


async def succeeded(store: Store) -> int:
    stats = await store.stats()
    return sum(q.get(str(TaskState.SUCCEEDED), 0) for q in stats.counts.values())


async def test_a_counter_counts_every_task_exactly_once_under_kills_and_pauses(
    store: Store,
    experts: Experts,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    effects = tmp_path / "effects"
    effects.mkdir()
    monkeypatch.setenv("CONTEND_EFFECT_LOG", str(effects))  # for the experts started below
    counter = counter_for(store, "hits")
    await counter.prepare()
    pace = PACE[db_url.partition(":")[0]]
    specs = [TaskSpec.build("count", ["hits", *pace], max_attempts=41) for _ in range(TASKS)]
    for i in range(0, TASKS, 1000):
        await store.submit(specs[i : i + 1000])
    chaos = Chaos(experts, random.Random(TASKS))
    for _ in range(EXPERTS):
        chaos.start()
    started = time.monotonic()
    deadline = started + DEADLINE
    struck, next_at = 0, started + GAP
    while (done := await succeeded(store)) < TASKS:
        chaos.replace_failed_starts()
        experts.check_alive()
        assert time.monotonic() < deadline, f"{done} of {TASKS} done: too slow or stuck"
        if time.monotonic() >= next_at:
            await chaos.strike(struck)
            struck += 1
            next_at = time.monotonic() + GAP
        await asyncio.sleep(0.05)
    seconds = time.monotonic() - started
    assert min(chaos.kills, chaos.pauses) >= AT_LEAST, (
        f"the run ended after {chaos.kills} kill(s) and {chaos.pauses} pause(s): too fast"
    )
    value = await counter.value()
    reruns, double = 0, []
    for i in range(0, TASKS, 500):
        for spec in specs[i : i + 500]:
            task = await store.get(spec.id, history=True)
            assert task.state == TaskState.SUCCEEDED, (spec.id, task.state, task.error)
            done_lines = [e for e in task.history if e.event == "succeeded"]
            if len(done_lines) != 1:
                double.append(spec.id)
            reruns += task.fence > 1
            assert task.result["fence"] == task.fence  # committed by the last owner
    made = sum(len(f.read_text().splitlines()) for f in effects.iterdir())
    print(
        f"\nexactly-once {db_url.partition(':')[0]}: {TASKS} tasks, counter {value}, "
        f"{made} increments made ({made - TASKS} rolled back), "
        f"{chaos.kills} kill -9, {chaos.pauses} SIGSTOP of {PAUSE * LEASE:.1f}s "
        f"(lease {LEASE:.1f}s), {chaos.restarts} failed start(s) replaced, "
        f"{reruns} tasks claimed more than once, "
        f"{seconds:.1f}s ({TASKS / seconds:.0f} tasks/s with the faults)"
    )
    assert double == []
    assert value == TASKS
    assert made >= TASKS  # every committed increment was logged first
    assert reruns > 0  # the faults did hit running tasks
