"""Task types used by the acceptance tests (imported by expert subprocesses)."""

from __future__ import annotations

import asyncio
from typing import Any

from contend import App, TaskContext

app = App()


@app.task(retries=5)
async def stepper(ctx: TaskContext, steps: int, step_time: float) -> dict[str, Any]:
    """Counts to *steps*, checkpointing after each, so a new owner resumes where it stopped."""
    state = ctx.state or {"done": 0, "resumed_from": 0, "owners": []}
    if state["done"] and not state["resumed_from"]:
        state["resumed_from"] = state["done"]
    state["owners"].append(ctx.expert)
    while state["done"] < steps:
        await asyncio.sleep(step_time)
        state["done"] += 1
        await ctx.checkpoint(state)
    return {
        "done": state["done"],
        "resumed_from": state["resumed_from"],
        "fence": ctx.fence,
        "owners": state["owners"],
        "by": ctx.expert,
    }


@app.task(retries=5)
async def slow(ctx: TaskContext, seconds: float) -> dict[str, Any]:
    """Sleeps in small steps without checkpoints, then reports who ran it."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        await asyncio.sleep(0.02)
    return {"by": ctx.expert, "fence": ctx.fence}


@app.task
def echo(value: Any) -> Any:
    return value


@app.task
async def report(ctx: TaskContext, steps: int) -> int:
    """Reports its progress at each step (ctx.progress)."""
    for i in range(1, steps + 1):
        await asyncio.sleep(0.05)
        await ctx.progress(i, steps, f"step {i} of {steps}")
    return steps
