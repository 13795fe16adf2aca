"""Task types for ``contend bench``: as cheap as a task can be, to measure the machinery.

Each comes as a coroutine function and as a plain function (``*_sync``): most users write
plain functions, and an expert runs those differently (off its event loop), so both are
measured."""

from __future__ import annotations

import time

from contend import App

app = App()


@app.task
async def noop() -> None:
    return None


@app.task
async def stamp() -> float:
    """Returns when it started, on this host's clock (the same clock the SQLite store uses)."""
    return time.time()


@app.task
def noop_sync() -> None:
    """:func:`noop` as the plain function most users write: it runs in a worker thread."""
    return None


@app.task
def stamp_sync() -> float:
    """:func:`stamp` as a plain function."""
    return time.time()
