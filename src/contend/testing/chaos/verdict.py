"""The checks every chaos scenario ends with, and the figures they give.

* every task submitted is terminal, ``succeeded``, with the result its arguments call for
  (a task missing, failed, dead, stuck or wrong is **lost**);
* exactly one ``succeeded`` line in each task's history (more: a **double commit**);
* no two runs of a task overlap in time (from the side-effect logs: an older owner acting after
  a newer one began is acting past its lease deadline);
* every zombie write — a stopped run writing with its old fence once a newer owner holds the
  task — is **refused**, and so is every commit the experts report refused;
* **recovery**: seconds from each fault to the next progress of each task it interrupted;
* no expert died on its own, and the faults did interrupt something.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from contend.domain.task import Task, TaskState
from contend.store.port import Store
from contend.testing.chaos.effects import Effects, median
from contend.testing.chaos.scenario import Fault, Run
from contend.testing.chaos.workload import expected


@dataclass
class Figures:
    """What one scenario on one backend shows."""

    backend: str
    scenario: str
    fault: str  # what was injected, in words
    faults: int = 0
    tasks: int = 0
    lost: int = 0
    double_commits: int = 0
    overlaps: int = 0
    refused: int = 0  # zombie writes and commits the store refused
    landed: int = 0  # zombie writes the store accepted (a bug)
    paused_effects: int = 0  # effects a pause between check and write made late
    recovery: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the scenario
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    known: str | None = None  # the bug it is known to fail for (reported, not fixed)

    @property
    def ok(self) -> bool:
        """Every check held."""
        return not self.problems

    @property
    def as_expected(self) -> bool:
        """Passed, or failed for its known bug only (a known bug that did not show is not)."""
        return self.ok != bool(self.known)

    @property
    def verdict(self) -> str:
        if self.known:
            return "KNOWN" if not self.ok else "XPASS"
        return "ok" if self.ok else "FAIL"

    def recovery_text(self) -> str:
        if not self.recovery:
            return "—"
        r = self.recovery
        return f"{min(r):.2f} / {median(r):.2f} / {max(r):.2f} s ({len(r)} tasks)"

    def line(self) -> str:
        return (
            f"{self.verdict:5} {self.backend:8} {self.scenario:14} faults={self.faults} "
            f"tasks={self.tasks} lost={self.lost} double={self.double_commits} "
            f"overlaps={self.overlaps} refused={self.refused} "
            f"recovery={self.recovery_text()} ({self.seconds:.0f}s)"
        )


async def _histories(store: Store, ids: list[str]) -> dict[str, Task]:
    gate = asyncio.Semaphore(16)

    async def one(task_id: str) -> Task:
        async with gate:
            return await store.get(task_id, history=True)

    tasks = await asyncio.gather(*(one(i) for i in ids))
    return {t.id: t for t in tasks}


def _wrong(task: Task | None, seed: int, steps: int) -> str | None:
    if task is None:
        return "missing"
    if task.state != TaskState.SUCCEEDED:
        return f"{task.state} (attempts {task.attempts}, error {str(task.error)[:200]})"
    if task.result != expected(seed, steps):
        return f"wrong result {task.result!r}"
    return None


async def check_store(run: Run, figures: Figures) -> dict[str, Task]:
    store = await run.open()
    listed = await store.list_tasks(limit=len(run.expected) + 1000)
    found = {t.id for t in listed}
    extra = found - run.expected.keys()
    if extra:
        figures.problems.append(f"{len(extra)} task(s) nobody submitted, e.g. {sorted(extra)[:3]}")
    tasks = await _histories(store, sorted(found & run.expected.keys()))
    wrong = []
    for task_id, (seed, steps) in run.expected.items():
        task = tasks.get(task_id)
        why = _wrong(task, seed, steps)
        if why:
            wrong.append(f"{task_id}: {why}")
        if task is not None:
            commits = [e for e in task.history if e.event == "succeeded"]
            if len(commits) > 1:
                figures.double_commits += 1
                figures.problems.append(f"task {task_id} committed {len(commits)} times")
    figures.tasks = len(run.expected)
    figures.lost = len(wrong)
    if wrong:
        figures.problems.append(f"{len(wrong)} task(s) lost or wrong: {'; '.join(wrong[:5])}")
    return tasks


REFUSED_COMMIT = re.compile(r"commit refused")


def check_effects(run: Run, figures: Figures) -> Effects:
    effects = Effects.read(run.effects)
    overlaps, paused = effects.overlaps()
    figures.overlaps = len(overlaps)
    figures.paused_effects = len(paused)
    if overlaps:
        worst = max(overlaps, key=lambda o: o.seconds)
        figures.problems.append(f"{len(overlaps)} overlapping run(s); the worst: {worst}")
    for p in paused:
        figures.notes.append(
            f"an effect written {p.old.last_effect - p.old.last_check:.2f}s after its check, "
            f"the process paused in between (no check can prevent it; the fence can): {p}"
        )
    refused, landed, unsure = effects.zombie_counts()
    reported = len(REFUSED_COMMIT.findall(run.experts.logs()))
    stopped = [r for runs in effects.runs.values() for r in runs if r.why == "FencedOut"]
    by_store = sum(1 for r in stopped if r.by == "store")
    figures.refused = refused + reported + by_store
    if len(stopped) > by_store:
        figures.notes.append(
            f"{len(stopped) - by_store} checkpoint(s) held back by their expert (lease unsafe)"
        )
    figures.landed = landed
    if landed:
        bad = [z for z in effects.zombies if z.get("refused") is False][:3]
        figures.problems.append(f"{landed} zombie write(s) landed: {bad}")
    if unsure:
        figures.notes.append(f"{unsure} zombie write(s) neither refused nor landed (no answer)")
    return effects


def check_recovery(run: Run, effects: Effects, figures: Figures, tasks: dict[str, Task]) -> None:
    interrupted_any = 0
    slowest: tuple[float, str, Fault] | None = None
    for fault in run.faults:
        if fault.interrupts:
            runs = effects.interrupted(fault.at, fault.experts)
            interrupted_any += len(runs)
        else:
            runs = effects.running_at(fault.at, fault.experts)
        for r in runs:
            seconds = effects.recovery(r, fault.at, takeover=fault.interrupts)
            if seconds is not None:
                figures.recovery.append(seconds)
                if slowest is None or seconds > slowest[0]:
                    slowest = (seconds, r.task, fault)
            elif fault.interrupts:
                figures.problems.append(
                    f"task {r.task}, interrupted by {fault.kind} on {r.expert}, never progressed"
                )
    if run.faults and any(f.interrupts for f in run.faults) and not interrupted_any:
        figures.problems.append("the faults interrupted no run: the scenario tested nothing")
    if slowest is not None and slowest[1] in tasks:
        seconds, task_id, fault = slowest
        lines = ", ".join(
            f"{e.at - fault.wall:+.2f}s {e.event} f{e.fence} {e.expert or ''}".rstrip()
            for e in tasks[task_id].history
        )
        figures.notes.append(
            f"slowest recovery {seconds:.2f}s, task {task_id} after {fault.kind}; its history "
            f"from the fault: {lines}"
        )


async def judge(run: Run, scenario: str, fault: str, seconds: float) -> Figures:
    figures = Figures(run.backend.name, scenario, fault, faults=len(run.faults), seconds=seconds)
    figures.problems += run.problems
    figures.notes += run.notes
    figures.problems += [f"expert died on its own: {d}" for d in run.experts.died()]
    if not run.faults:
        figures.problems.append("no fault was injected")
    tasks = await check_store(run, figures)
    effects = check_effects(run, figures)
    check_recovery(run, effects, figures, tasks)
    return figures
