"""Task types for benchmarks/fair_share.py (imported by its expert processes): the same tiny
async work twice, once with fair share per tenant and once without, on the same queue."""

from __future__ import annotations

import asyncio

from contend import App

app = App()


@app.task(fair=True, limit_key="tenant:{tenant}")
async def fair_work(tenant: str, n: int) -> int:
    """Claims of the queue share its slots among the tenants (``fair_order``)."""
    await asyncio.sleep(0.001)
    return n


@app.task
async def plain_work(tenant: str, n: int) -> int:
    """The same work, claimed first in, first out whoever submitted it."""
    await asyncio.sleep(0.001)
    return n
