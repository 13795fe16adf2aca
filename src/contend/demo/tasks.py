"""Tasks of ``contend demo``: web-server log chunks generated from a seed, parsed and aggregated.

Every result can be recomputed from the task's arguments, so the demo can check that each
committed result is right as well as committed exactly once.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from typing import Any

from contend import App, TaskContext

app = App()

PATHS = [
    "/",
    "/login",
    "/api/orders",
    "/api/items",
    "/static/app.js",
    "/static/site.css",
    "/search",
    "/cart",
    "/checkout",
    "/api/users",
    "/health",
    "/docs",
]
STATUSES = [200] * 20 + [201, 204, 301, 302, 304, 400, 401, 403, 404, 404, 500, 502, 503]
AGENTS = ["Mozilla/5.0", "curl/8.5", "python-httpx/0.27", "Go-http-client/1.1"]
LINE = re.compile(
    r'(?P<ip>\S+) - - \[(?P<ts>[^\]]+)\] "(?P<method>\w+) (?P<path>\S+) HTTP/1\.1" '
    r'(?P<status>\d{3}) (?P<size>\d+) "(?P<agent>[^"]*)"'
)


def generate(seed: int, lines: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        ip = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        method = rng.choice(("GET", "GET", "GET", "POST", "PUT", "DELETE"))
        out.append(
            f"{ip} - - [30/Nov/2026:{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d} +0000] "
            f'"{method} {rng.choice(PATHS)} HTTP/1.1" {rng.choice(STATUSES)} '
            f'{rng.randrange(120, 90_000)} "{rng.choice(AGENTS)}"'
        )
    return out


def aggregate(seed: int, lines: int) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    paths: Counter[str] = Counter()
    size = errors = 0
    for line in generate(seed, lines):
        m = LINE.match(line)
        if m is None:
            errors += 1
            continue
        statuses[m["status"]] += 1
        paths[m["path"]] += 1
        size += int(m["size"])
    return {
        "seed": seed,
        "lines": lines,
        "bytes": size,
        "status": dict(sorted(statuses.items())),
        "top_paths": [p for p, _ in sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[:3]],
        "unparsed": errors,
    }


@app.task(retries=3)
def parse_logs(seed: int, lines: int) -> dict[str, Any]:
    """Parse one chunk of access log and count statuses, bytes and paths."""
    return aggregate(seed, lines)


@app.task(retries=3, requirements=["geo"])
def geo_summary(seed: int, lines: int) -> dict[str, Any]:
    """Needs an expert with the ``geo`` capability (it has the address database)."""
    regions: Counter[str] = Counter()
    for line in generate(seed, lines):
        second = int(line.split(".", 2)[1])
        regions[("eu", "us", "apac", "latam")[second % 4]] += 1
    return {"seed": seed, "regions": dict(sorted(regions.items()))}


@app.task(retries=5, timeout=120)
async def daily_report(ctx: TaskContext, day: int, steps: int) -> dict[str, Any]:
    """A long task that checkpoints after every step, so a new owner resumes where it stopped."""
    state = ctx.state or {"step": 0, "total": 0, "resumed_at": None}
    if state["step"] and state["resumed_at"] is None:
        state["resumed_at"] = state["step"]
    while state["step"] < steps:
        await asyncio.sleep(0.05)  # stands in for a slow query
        state["total"] += sum(aggregate(day * 1000 + state["step"], 50)["status"].values())
        state["step"] += 1
        await ctx.checkpoint(state)
    return {
        "day": day,
        "lines": state["total"],
        "resumed_at": state["resumed_at"],
        "fence": ctx.fence,
    }
