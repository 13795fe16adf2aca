"""Task types with rate limits and fair share for tests/acceptance/test_limits.py (imported
by expert processes)."""

from __future__ import annotations

import asyncio
import os

from contend import App

app = App()


@app.task(rate_limit="20/s", limit_key="tenant:{tenant}")
async def call_api(tenant: str, n: int) -> int:
    return n


@app.task(fair=True, limit_key="tenant:{tenant}")
async def report(tenant: str, n: int) -> int:
    await asyncio.sleep(0.002)
    return n


@app.task(concurrency_limit=1, limit_key="door:{door}")
async def hold(door: str, release: str) -> None:
    """Runs until the file *release* exists: one at a time per door."""
    while not os.path.exists(release):
        await asyncio.sleep(0.01)
