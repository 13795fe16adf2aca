"""A three-stage pipeline for the acceptance tests of ``contend status`` (imported by expert
subprocesses and by the CLI through ``--app``).

Each record carries the path of a gate file: the last stage holds its tasks running until
that file exists, so that a test can see a stage's running tasks before it sees its rate."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from contend import App

app = App()

#: How long the last stage waits for its gate before it gives up (a test that forgets it).
GATE_WAIT = 60.0


def split(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"word": w, "gate": r["gate"]} for r in lines for w in r["text"].split()]


def upper(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(w, word=w["word"].upper()) for w in words]


async def count(words: list[dict[str, Any]]) -> int:
    loop = asyncio.get_running_loop()
    end = loop.time() + GATE_WAIT
    while not all(os.path.exists(w["gate"]) for w in words) and loop.time() < end:
        await asyncio.sleep(0.02)
    return len(words)


words = app.pipeline("words", split, upper, count, batch=2)
