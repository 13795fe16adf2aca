"""A periodic task type for tests/acceptance/test_periodic.py (imported by expert processes)."""

from __future__ import annotations

from contend import App, TaskContext

app = App()


@app.periodic(every=1)
async def beat(ctx: TaskContext, tick: str) -> dict[str, str]:
    return {"tick": tick, "by": ctx.expert}
