"""Reading the side-effect logs the chaos workload writes, and what they show.

Every line is one event of one run of one task (see :mod:`contend.testing.chaos.workload`); a
run is named by its task and fence, since every claim gives a task a new fence. From them:

* the **runs** of each task, with their first and last side effect on the host's monotonic clock;
* **overlaps**: two runs of one task whose side effects interleave in time — the older owner
  was let act (by ``ctx.check()``) after the newer one had started, i.e. past the older one's
  lease deadline (a newer owner exists only once the older lease lapsed); an effect written
  late because the process was paused between its check and the write is told apart;
* the **zombie writes**: what the store said to a stopped run's writes with its old fence;
* **recovery**: for a task a fault interrupted, the time from the fault to the next progress the
  store acknowledged (a newer owner's start, or a checkpoint).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    """One run of one task: one owner, one fence."""

    task: str
    fence: int
    expert: str
    started: float  # monotonic
    last_effect: float  # the last tick: a side effect (the start, if none)
    last_check: float  # when ctx.check() last let it go on to a tick (the start, if none)
    ended: str | None = None  # "done", "stop", or None: killed (or still running)
    ended_at: float | None = None
    why: str | None = None  # for a stop: what ended the run (CancelledError, TaskStopped, …)
    by: str | None = None  # for a refused checkpoint: who refused it (store, expert)
    ticks: int = 0
    checkpoints: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Overlap:
    task: str
    old: Run
    new: Run

    @property
    def seconds(self) -> float:
        return self.old.last_effect - self.new.started

    def __str__(self) -> str:
        return (
            f"task {self.task}: {self.old.expert} (fence {self.old.fence}) acted until "
            f"{self.old.last_effect:.3f}, {self.new.expert} (fence {self.new.fence}) from "
            f"{self.new.started:.3f}: {self.seconds:.3f}s of overlap"
        )


@dataclass
class Effects:
    """Everything the logs of one scenario hold."""

    runs: dict[str, list[Run]] = field(default_factory=dict)  # task -> runs, by fence
    zombies: list[dict[str, Any]] = field(default_factory=list)
    lines: int = 0

    @classmethod
    def read(cls, folder: Path) -> Effects:
        found = cls()
        by_key: dict[tuple[str, int], Run] = {}
        for path in sorted(folder.glob("*.jsonl")):
            for raw in path.read_text(errors="replace").splitlines():
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # a line cut short by kill -9
                found.lines += 1
                found._add(line, by_key)
        for runs in found.runs.values():
            runs.sort(key=lambda r: r.fence)
        return found

    def _add(self, line: dict[str, Any], by_key: dict[tuple[str, int], Run]) -> None:
        kind, key, at = line["k"], (line["t"], int(line["f"])), float(line["m"])
        if kind == "zombie":
            self.zombies.append(line)
            return
        run = by_key.get(key)
        if run is None:
            run = Run(key[0], key[1], line["e"], started=at, last_effect=at, last_check=at)
            by_key[key] = run
            self.runs.setdefault(key[0], []).append(run)
        if kind == "start":
            run.started = min(run.started, at)
        elif kind == "tick":
            run.last_effect = max(run.last_effect, at)
            run.last_check = max(run.last_check, float(line.get("c", at)))
            run.ticks += 1
        elif kind == "ckpt":
            # when the answer was seen, not an act: the store took the write when it came, and
            # a pause between the two makes the answer late, never the write
            run.checkpoints.append(at)
        elif kind in ("done", "stop"):
            run.ended, run.ended_at = kind, at
            run.why, run.by = line.get("why"), line.get("by")

    # -- what they show --------------------------------------------------------------------
    def overlaps(self) -> tuple[list[Overlap], list[Overlap]]:
        """Pairs of runs of one task where the older one acted after the newer one began:
        (those where ``ctx.check()`` let it act after that — the runtime's failure — and those
        where the check came before and the process was paused between the check and the
        effect, which no check can prevent: what the fence handed to external systems is for).
        """
        failures, paused = [], []
        for task, runs in self.runs.items():
            for n, old in enumerate(runs):
                for new in runs[n + 1 :]:
                    if old.last_check > new.started:
                        failures.append(Overlap(task, old, new))
                    elif old.last_effect > new.started:
                        paused.append(Overlap(task, old, new))
        return failures, paused

    def running_at(self, at: float, experts: Iterable[str] | None = None) -> list[Run]:
        """The runs (of *experts*, or anyone's) that had begun and not ended at *at*."""
        names = None if experts is None else set(experts)
        return [
            run
            for runs in self.runs.values()
            for run in runs
            if run.started <= at
            and (run.ended_at is None or run.ended_at > at)
            and (names is None or run.expert in names)
        ]

    def recovery(self, run: Run, fault_at: float, *, takeover: bool) -> float | None:
        """Seconds from *fault_at* to the next progress of *run*'s task the store
        acknowledged: a newer run's start or checkpoint, and when not *takeover* (the run was
        not meant to stop) also this run's own next checkpoint; None if none came."""
        times = [
            t
            for other in self.runs.get(run.task, [])
            if other.fence > run.fence or (other is run and not takeover)
            for t in ([other.started] if other is not run else []) + other.checkpoints
            if t > fault_at
        ]
        return min(times) - fault_at if times else None

    def interrupted(self, fault_at: float, experts: Iterable[str] | None = None) -> list[Run]:
        """Runs the fault at *fault_at* cost: in flight then and never finished (stopped or
        killed), or finished in the second before it but run again by a newer owner after it
        (their result was not committed yet)."""
        names = None if experts is None else set(experts)
        hit = [r for r in self.running_at(fault_at, experts) if r.ended != "done"]
        seen = {id(r) for r in hit}
        for runs in self.runs.values():
            for n, r in enumerate(runs):
                if (
                    id(r) not in seen
                    and r.ended_at is not None
                    and fault_at - 1.0 <= r.ended_at <= fault_at
                    and (names is None or r.expert in names)
                    and any(later.started > fault_at for later in runs[n + 1 :])
                ):
                    hit.append(r)
        return hit

    def zombie_counts(self) -> tuple[int, int, int]:
        """(refused, landed, inconclusive) zombie writes."""
        refused = sum(1 for z in self.zombies if z.get("refused") is True)
        landed = sum(1 for z in self.zombies if z.get("refused") is False)
        return refused, landed, len(self.zombies) - refused - landed


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
