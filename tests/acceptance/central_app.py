"""A central queue for tests/acceptance/test_central.py (imported by expert processes)."""

from __future__ import annotations

import asyncio

from contend import App

app = App()
app.queue("c", mode="central")


@app.task(queue="c")
async def work(n: int) -> int:
    await asyncio.sleep(0.02)
    return n
