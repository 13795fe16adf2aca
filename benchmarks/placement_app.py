"""Task types for the real multi-process placement run (``benchmarks.placement``).

Each task sleeps for its kind's base duration times its size, divided by the speed of the
expert that runs it, looked up by name in :data:`SPEED`: the experts of the run are named so
that some are four times faster at one kind, as in the simulation.
"""

from __future__ import annotations

import asyncio

from contend import App, TaskContext

app = App()

#: Seconds a task of size 1 takes at speed 1.
BASE = {"thumbnail": 0.10, "transcode": 0.40, "infer": 0.25}

#: expert name -> kind -> speed (1.0 when absent).
SPEED: dict[str, dict[str, float]] = {
    "gpu-0": {"infer": 4.0},
    "tx-0": {"transcode": 4.0},
    "tx-1": {"transcode": 4.0},
    "th-0": {"thumbnail": 4.0},
    "th-1": {"thumbnail": 4.0},  # the far zone's pair (benchmarks/placement_zones.py)
    "tx-2": {"transcode": 4.0},
}

#: expert name -> (CLI options that make it what SPEED says it is).
EXPERTS: dict[str, list[str]] = {
    "gpu-0": ["--capability", "gpu", "--specialty", "infer"],
    "tx-0": ["--specialty", "transcode"],
    "tx-1": ["--specialty", "transcode"],
    "th-0": ["--specialty", "thumbnail"],
}

#: The options of every expert any run starts: EXPERTS and the far zone's pair.
EXPERT_OPTS: dict[str, list[str]] = {
    **EXPERTS,
    "th-1": ["--specialty", "thumbnail"],
    "tx-2": ["--specialty", "transcode"],
}


async def _work(ctx: TaskContext, kind: str, size: float) -> dict[str, object]:
    seconds = BASE[kind] * size / SPEED.get(ctx.expert, {}).get(kind, 1.0)
    await asyncio.sleep(seconds)
    return {"expert": ctx.expert, "seconds": seconds}


@app.task
async def thumbnail(ctx: TaskContext, size: float = 1.0) -> dict[str, object]:
    return await _work(ctx, "thumbnail", size)


@app.task
async def transcode(ctx: TaskContext, size: float = 1.0) -> dict[str, object]:
    return await _work(ctx, "transcode", size)


@app.task(requirements=["gpu"])
async def infer(ctx: TaskContext, size: float = 1.0) -> dict[str, object]:
    return await _work(ctx, "infer", size)
