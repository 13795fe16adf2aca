"""What the metrics hook costs per task.

``python -m benchmarks.metrics_hook [--tasks 2000] [--runs 5]`` measures it two ways:

* **the hook's own calls**: the moments one task reaches it (its share of a claim batch of 32
  and one ``after_execute``), called a million times in a loop, through the expert's
  ``Hooks`` dispatcher, with the expert's own two hooks in front as in a real expert; against
  the same dispatcher without the metrics hook. This is the figure to hold small.
* **a drain**: one expert (concurrency 32, race window 0) on the memory store drains
  ``--tasks`` no-op tasks, with and without the hook, alternating, ``--runs`` times each; the
  medians' difference per task. The store is in memory so that the hook's share is not lost
  in a store's cost; the figure still swings with the machine's mood by a few µs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from contend import App, Expert
from contend.metrics import MetricsHook
from contend.runtime.hooks import ExpertStats, Hook, Hooks, TaskLog
from contend.store.memory import MemoryStore
from contend.store.port import Claimed, Completion, Failure

BATCH = 32


def per_task_calls(with_metrics: bool, n: int = 1_000_000) -> float:
    """µs per task of the hook moments one task causes, through the dispatcher."""
    hooks = Hooks([ExpertStats(), TaskLog(), *([MetricsHook()] if with_metrics else [])])
    tasks = [
        Claimed(f"t{i}", "job", "default", [], {}, 1, 1, 3, None, None, 0.0) for i in range(BATCH)
    ]
    done = Completion("t0", 1, "null")
    rounds = n // BATCH
    started = time.perf_counter()
    for _ in range(rounds):
        hooks.on_claimed("e", tasks, BATCH)
        for task in tasks:
            hooks.before_execute("e", task)
            hooks.after_execute("e", task, done, 0.001, None)
            hooks.on_committed("e", done)
    return (time.perf_counter() - started) / (rounds * BATCH) * 1e6


class Done(Hook):
    """Sets ``all`` once *n* outcomes were committed (in both variants alike)."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.all = asyncio.Event()

    def on_committed(self, expert: str, outcome: Completion | Failure) -> None:
        self.left -= 1
        if self.left == 0:
            self.all.set()


async def drain(n: int, with_metrics: bool) -> float:
    """Seconds one expert takes to drain *n* no-op tasks from a memory store."""
    store = MemoryStore("memory://")
    app = App("memory://", store_factory=lambda url: store)

    @app.task
    async def noop() -> None:
        return None

    await store.open()
    await app.submit_many([app.build_spec(noop) for _ in range(n)])
    done = Done(n)
    hooks = [done, *([MetricsHook()] if with_metrics else [])]
    expert = Expert(app, name="bench", concurrency=32, window=0, hooks=hooks)
    runner = asyncio.create_task(expert.run())
    started = time.perf_counter()
    await done.all.wait()
    seconds = time.perf_counter() - started
    expert.stop()
    await runner
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    plain = statistics.median(per_task_calls(False) for _ in range(3))
    metered = statistics.median(per_task_calls(True) for _ in range(3))
    print(f"hook calls per task: {plain:.2f} µs without, {metered:.2f} µs with the metrics hook")
    print(f"  the metrics hook adds {metered - plain:.2f} µs per task")
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.runs):
        for with_metrics in (False, True):
            times[with_metrics].append(asyncio.run(drain(args.tasks, with_metrics)))
    a, b = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"drain of {args.tasks} tasks (median of {args.runs}): {a / args.tasks * 1e6:.1f} µs "
        f"per task without, {b / args.tasks * 1e6:.1f} µs with: "
        f"{(b - a) / args.tasks * 1e6:+.1f} µs per task"
    )


if __name__ == "__main__":
    main()
