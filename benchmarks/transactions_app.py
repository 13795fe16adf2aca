"""The app of ``benchmarks.transactions``: a no-op task; one that increments one counter (a
single row or key every task writes) in the store's own database in its transaction
(``ctx.transaction()``); and one that writes a row (key) of its own there the same way."""

from __future__ import annotations

from contend import App, TaskContext
from contend.testing.counters import counter_for

app = App()


@app.task
async def plain() -> None:
    return None


@app.task
async def counted(ctx: TaskContext) -> None:
    counter = counter_for(await app.store(), "bench")
    await ctx.transact(counter.add, tries=100)


@app.task
async def own_row(ctx: TaskContext) -> None:
    counter = counter_for(await app.store(), ctx.task_id)
    await ctx.transact(counter.add, tries=100)
