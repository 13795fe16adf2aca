"""Task types with rate limits and fair share for tests/acceptance/test_limits.py (imported
by expert processes)."""

from __future__ import annotations

import asyncio

from contend import App

app = App()


@app.task(rate_limit="20/s", limit_key="tenant:{tenant}")
async def call_api(tenant: str, n: int) -> int:
    return n


@app.task(fair=True, limit_key="tenant:{tenant}")
async def report(tenant: str, n: int) -> int:
    await asyncio.sleep(0.002)
    return n
