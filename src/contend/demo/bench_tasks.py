"""Task types for ``contend bench``: as cheap as a task can be, to measure the machinery.

Each comes as a coroutine function and as a plain function (``*_sync``): most users write
plain functions, and an expert runs those differently (off its event loop), so both are
measured."""

from __future__ import annotations

import socket
import time

from contend import App

app = App()


@app.task
async def noop() -> None:
    return None


def _tell(key: int | None, port: int | None, when: float) -> float:
    """Send ``key when`` to the benchmark on *port* (UDP, this host), as the peers' tasks do."""
    if port is not None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(f"{key} {when:.6f}".encode(), ("127.0.0.1", port))
    return when


@app.task
async def stamp(key: int | None = None, port: int | None = None) -> float:
    """Returns when it started, on this host's clock (the same clock the SQLite store uses);
    with a *port*, also sends it there (``contend bench``'s latency probe)."""
    return _tell(key, port, time.time())


@app.task
def noop_sync() -> None:
    """:func:`noop` as the plain function most users write: it runs in a worker thread."""
    return None


@app.task
def stamp_sync(key: int | None = None, port: int | None = None) -> float:
    """:func:`stamp` as a plain function."""
    return _tell(key, port, time.time())
