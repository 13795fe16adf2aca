"""Task functions for tests/integration/test_isolation.py: module-level, so that the child
process that runs each call can import them by name."""

from __future__ import annotations

import os
import time
from pathlib import Path

from contend import TaskContext


class Unwelcome(Exception):
    """An error the test's retry policy does not retry."""


def add(a: int, b: int) -> int:
    print("noise on stdout, which must not confuse the parent")
    return a + b


async def add_async(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b, "pid": os.getpid()}


def refuse(x: int) -> None:
    raise Unwelcome(f"no {x}")


def not_json() -> object:
    return {1, 2}


def counts(ctx: TaskContext, n: int) -> int:
    """Reports its progress from the child, one step at a time."""
    for i in range(1, n + 1):
        ctx.progress_sync(i, n, f"step {i}")
    return n


def resume(ctx: TaskContext) -> dict[str, object]:
    """Saves a checkpoint on its first attempt and dies; the next attempt sees it."""
    if ctx.attempt == 1:
        ctx.checkpoint_sync({"done": 3})
        os._exit(3)  # as a crash would
    return {"state": ctx.state, "attempt": ctx.attempt, "fence": ctx.fence}


def spin(marker: str) -> None:
    """Never looks at ctx.cancelled: only a kill stops it. Writes its pid, then ticks."""
    path = Path(marker)
    path.with_suffix(".pid").write_text(str(os.getpid()))
    with path.open("a") as ticks:
        while True:
            ticks.write(f"{time.monotonic()}\n")
            ticks.flush()
            time.sleep(0.02)


def hog(mib: int, hold: float) -> int:
    """Holds *mib* MiB of memory it has written to (so it is resident) for *hold* seconds."""
    block = b"x" * (mib * 1024 * 1024)
    time.sleep(hold)
    return len(block) // (1024 * 1024)
