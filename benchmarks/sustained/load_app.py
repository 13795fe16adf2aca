"""The app of the sustained-load run's contend experts: ``stamp(key)`` sends its key back to
the benchmark over UDP when it starts (a coroutine function, and a plain one)."""

from __future__ import annotations

from benchmarks.peers.common import send_stamp
from contend import App

app = App()


@app.task
async def stamp(key: str) -> None:
    send_stamp(key)


@app.task
def stamp_sync(key: str) -> None:
    send_stamp(key)
