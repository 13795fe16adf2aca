"""App.store(): one store per event loop, however many callers ask for it while it opens."""

from __future__ import annotations

import asyncio

from contend import App
from contend.store.memory import MemoryStore


class SlowToOpen(MemoryStore):
    opened = 0

    async def open(self) -> None:
        SlowToOpen.opened += 1
        await asyncio.sleep(0)  # a real store awaits its connection here
        await asyncio.sleep(0)


async def test_callers_asking_at_once_share_one_store() -> None:
    SlowToOpen.opened = 0
    app = App("memory://", store_factory=SlowToOpen)
    stores = await asyncio.gather(*(app.store() for _ in range(5)))
    assert SlowToOpen.opened == 1  # before: five stores opened, four of them never closed
    assert all(s is stores[0] for s in stores)
    await app.aclose()
    assert await app.store() is not stores[0]  # a new one after closing
    await app.aclose()
