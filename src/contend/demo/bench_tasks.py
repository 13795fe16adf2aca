"""Task types for ``contend bench``: as cheap as a task can be, to measure the machinery."""

from __future__ import annotations

import time

from contend import App

app = App()


@app.task
async def noop() -> None:
    return None


@app.task
def sync_noop() -> None:
    """The same, as the plain function most users write: it runs in a worker thread."""
    return None


@app.task
async def stamp() -> float:
    """Returns when it started, on this host's clock (the same clock the SQLite store uses)."""
    return time.time()
