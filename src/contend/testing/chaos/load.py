"""Load: 20,000 tasks from three ``contend submit --batch`` processes running at once while the
experts drain them, with kills in the middle — of experts (kill -9, replacements started) and
of one submitter, killed after its first chunk and run again (a batch is resumable: its lines
already stored are not submitted twice)."""

from __future__ import annotations

import asyncio
import signal
import subprocess

from contend.testing.chaos.procs import submitter
from contend.testing.chaos.scenario import Run

SUBMITTERS = 3


async def load(run: Run) -> None:
    size = run.size
    for i in range(size.experts):
        run.experts.start(f"e{i}", concurrency=16)
    # The first submitter's batch is the largest (two chunks at least): it is killed after its
    # first chunk, then run again alongside the other two.
    first = max(2000, size.tasks * 2 // 5)
    rest = (size.tasks - first) // (SUBMITTERS - 1)
    shares = [first] + [rest] * (SUBMITTERS - 2) + [size.tasks - first - rest * (SUBMITTERS - 2)]
    batches = [
        run.batch_file(f"load{i}", n, steps=3, step_time=0.02, every=2)
        for i, n in enumerate(shares)
    ]
    logs = [run.workdir / f"submitter{i}.log" for i in range(SUBMITTERS)]
    victim = submitter(run.backend.url, batches[0], logs[0])

    async def first_chunk() -> bool:
        return sum((await run.counts()).values()) >= 1000

    await run.until(first_chunk, 120, "the first submitter's first chunk", every=0.02)
    if victim.poll() is None:
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait, 10)
        run.notes.append("submitter 0 was killed with SIGKILL after its first chunk, run again")
    else:
        run.problems.append("submitter 0 had finished before the kill: nothing was cut short")
    subs = [submitter(run.backend.url, b, log) for b, log in zip(batches, logs, strict=True)]
    for _ in range(size.rounds):
        await run.sleep(run.rng.uniform(1.0, 2.5))
        expert = await run.busy_expert()
        run.fault("kill -9 under load", (expert.name,))
        run.experts.kill(expert, signal.SIGKILL)
        run.experts.start(run.experts.replacement_name(expert.name), concurrency=16)
    for i, sub in enumerate(subs):
        try:
            code = await asyncio.to_thread(sub.wait, 600)
        except subprocess.TimeoutExpired:
            sub.kill()
            code = -9
        if code != 0:
            run.problems.append(f"submitter {i} exited {code}: {logs[i].read_text()[-1000:]}")
    await run.adopt()
    took = await run.until_all_done(size.pick(300, 900))
    run.notes.append(f"drained {size.tasks:,} tasks {took:.0f}s after the submitters were done")
