"""Task types used by the acceptance tests (imported by expert subprocesses)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from contend import App, TaskContext
from contend.testing.counters import counter_for

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


@app.task(retries=40)
async def count(
    ctx: TaskContext, name: str, wait: float = 0.0, hold: float = 0.0, hold_after: float = 0.0
) -> dict[str, Any]:
    """Adds one to counter *name* in the store's own database (``contend.testing.counters``):
    the increment and the task's completion commit in one transaction, so exactly once. It
    waits *wait* seconds before its transaction, then *hold* inside it before the increment
    and *hold_after* after it (work a fault can cut short). With ``CONTEND_EFFECT_LOG`` set to
    a folder, every increment made (committed or not) adds a line to a file there."""
    counter = counter_for(await app.store(), name)
    await asyncio.sleep(wait)

    async def body(tx: Any) -> dict[str, Any]:
        await asyncio.sleep(hold)
        await counter.add(tx)
        _log_effect(ctx)
        await asyncio.sleep(hold_after)
        return {"by": ctx.expert, "fence": ctx.fence}

    return await ctx.transact(body, tries=100)


_effects: dict[str, Any] = {}


def _log_effect(ctx: TaskContext) -> None:
    """One line per increment made, committed or not: the at-least-once count."""
    folder = os.environ.get("CONTEND_EFFECT_LOG")
    if not folder:
        return
    out = _effects.get("file")
    if out is None:
        out = _effects["file"] = open(  # noqa: SIM115 -- one per process, for its life
            os.path.join(folder, f"{ctx.expert}.{os.getpid()}.effects"), "a"
        )
    out.write(f"{ctx.task_id} {ctx.fence}\n")
    out.flush()  # in the kernel's hands: a kill -9 keeps it


@app.task
async def report(ctx: TaskContext, steps: int) -> int:
    """Reports its progress at each step (ctx.progress)."""
    for i in range(1, steps + 1):
        await asyncio.sleep(0.05)
        await ctx.progress(i, steps, f"step {i} of {steps}")
    return steps
