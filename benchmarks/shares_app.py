"""Task types for benchmarks/shares.py (imported by its expert processes). Each process
counts the runs of its bodies and writes the count when it exits, to
``$CONTEND_SHARES_DIR/<pid>.json``: who ran how many, without reading every task's history."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import time
from pathlib import Path

from contend import App

app = App()
_ran: dict[str, float] = {"tasks": 0, "first": 0.0, "last": 0.0}
#: runs per tenth of a second, by the wall clock's tenths (a timeline, to see who waited when)
_tenths: dict[int, int] = {}


def _count() -> None:
    now = time.time()
    if not _ran["tasks"]:
        _ran["first"] = now
    _ran["tasks"] += 1
    _ran["last"] = now
    k = int(now * 10)
    _tenths[k] = _tenths.get(k, 0) + 1


def _write() -> None:
    where = os.environ.get("CONTEND_SHARES_DIR")
    if where and _ran["tasks"] and os.path.isdir(where):
        Path(where, f"{os.getpid()}.json").write_text(json.dumps(_ran | {"tenths": _tenths}))


atexit.register(_write)


@app.task
def noop_sync(n: int) -> None:
    _count()


@app.task
async def noop_async(n: int) -> None:
    _count()


@app.task
async def sleep_async(n: int) -> None:
    """A millisecond of waiting: runs long enough that the slots, not the claims, bound."""
    _count()
    await asyncio.sleep(0.001)
