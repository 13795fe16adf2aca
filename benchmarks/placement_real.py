"""The real multi-process run: ``contend expert`` processes on one SQLite file, competition on
(``--window 0.05``) against competition off (``--window 0``, which claims like a FIFO queue).

Both runs get the same seeded workload (:mod:`benchmarks.placement_app`); the makespan is taken
from the store's own timestamps: from the batch's commit to the last completion.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from benchmarks import placement_app as pa
from contend.domain.task import TaskState
from contend.store.registry import open_store

APP = "benchmarks.placement_app:app"
MIX = (("thumbnail", 0.40), ("transcode", 0.35), ("infer", 0.25))


def workload(n: int, seed: int) -> list[tuple[str, float]]:
    rng = random.Random(seed)
    kinds = [k for k, _ in MIX]
    weights = [w for _, w in MIX]
    return [
        (rng.choices(kinds, weights=weights)[0], round(rng.uniform(0.5, 1.5), 3)) for _ in range(n)
    ]


async def run_once(
    window: float, jobs: list[tuple[str, float]], concurrency: int
) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="contend-placement-")
    url = f"sqlite:///{os.path.join(tmp, 'placement.db')}"
    store = await open_store(url)
    procs = []
    try:
        for name, opts in pa.EXPERTS.items():
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "contend",
                    "--log-level",
                    "WARNING",
                    "expert",
                    APP,
                    "--store",
                    url,
                    "--name",
                    name,
                    "--concurrency",
                    str(concurrency),
                    "--window",
                    str(window),
                    *opts,
                    stdin=asyncio.subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + 30
        while len([e for e in await store.list_experts() if e.alive]) < len(procs):
            if time.monotonic() > deadline:
                raise RuntimeError("experts did not start within 30 s")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # let every expert learn its rivals before work arrives
        specs = [pa.app.build_spec(kind, kwargs={"size": size}) for kind, size in jobs]
        await store.submit(specs)
        t0 = await store.now()
        deadline = time.monotonic() + 120
        while True:
            done = await store.list_tasks(state=TaskState.SUCCEEDED, limit=len(specs))
            if len(done) >= len(specs):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(done)}/{len(specs)} tasks done after 120 s")
            await asyncio.sleep(0.1)
        # the experts' claim counters, as of a heartbeat after the last task was done
        ended = await store.now()
        deadline = time.monotonic() + 30
        while True:
            experts = [e for e in await store.list_experts() if e.alive]
            if all(e.heartbeat_at > ended for e in experts):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the experts did not renew within 30 s")
            await asyncio.sleep(0.1)
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        await asyncio.gather(*(p.wait() for p in procs))
        await store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    makespan = max(t.updated_at for t in done) - t0
    fast = sum(1 for t in done if pa.SPEED.get(t.result["expert"], {}).get(t.type, 1.0) > 1.0)
    busy = sum(float(t.result["seconds"]) for t in done)
    return {
        "window": window,
        "tasks": len(done),
        "makespan": round(makespan, 3),
        "mean_completion": round(sum(t.updated_at - t0 for t in done) / len(done), 3),
        "on_a_fast_expert": round(fast / len(done), 3),
        "work_seconds": round(busy, 3),  # slot-seconds spent running tasks
        # every task id a claim named counts as attempted (Result.claim_attempts)
        "claim_attempts": sum(e.claim_attempts for e in experts),
        "claims_won": sum(e.claims_won for e in experts),
    }


async def run(n: int = 300, seed: int = 1, rounds: int = 2, concurrency: int = 2) -> dict[str, Any]:
    """Alternate the two modes *rounds* times on the same workload."""
    jobs = workload(n, seed)
    runs: list[dict[str, Any]] = []
    for _ in range(rounds):
        for window in (0.05, 0.0):
            runs.append(await run_once(window, jobs, concurrency))
            print(
                f"  real, window {window:.2f}: makespan {runs[-1]['makespan']:.2f} s, "
                f"mean completion {runs[-1]['mean_completion']:.2f} s, "
                f"{runs[-1]['on_a_fast_expert']:.0%} on a fast expert, "
                f"{runs[-1]['claim_attempts'] / n:.2f} claims per task, success "
                f"{runs[-1]['claims_won'] / max(1, runs[-1]['claim_attempts']):.0%}",
                flush=True,
            )
    return {
        "experts": {name: " ".join(opts) for name, opts in pa.EXPERTS.items()},
        "concurrency": concurrency,
        "tasks": n,
        "base_seconds": pa.BASE,
        "runs": runs,
    }


if __name__ == "__main__":
    print(asyncio.run(run()))
