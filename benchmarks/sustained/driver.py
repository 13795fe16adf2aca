"""The sustained-load run, whatever the system: a producer at a fixed rate, start stamps over
UDP, the store's size every few seconds, and (optionally) a session that holds back cleanup.

A *system* (contend on one backend, or PgQueuer) gives the driver four coroutines: ``start()``
its workers, ``submit(keys)`` a batch of ``stamp`` tasks, one per key (a key is ``SEQ@OFFSET``,
the task's number and its submit time in seconds from the start; the task sends its key back
when it starts), ``size()`` of its store in bytes, ``stop()``. The driver needs the standard library and
psycopg only, so it runs in either virtualenv.

* **Producer**: every 10 ms it submits, in one call, as many tasks as the rate owes by then
  (1,000/s: about 10 a call); each task carries its submit time.
* **Pickup latency**: from that submit time to the task's first line, which sends it back over
  UDP. Figures per 10 s window by submit time: submitted, started, p50, p99 (the tasks of a
  window that never started count in ``not_started``); and p50, p99 per second.
* **Hold**: from ``hold_from`` to ``hold_to`` (fractions of the run), on PostgreSQL a separate
  connection runs ``BEGIN; SELECT txid_current();`` and stays idle in that transaction, so
  vacuum can remove no row deleted or updated after it began; on SQLite a connection holds a
  read transaction open, so no checkpoint can move the WAL past it and the WAL file grows.
* **Recovery**: seconds after the hold ended until the first 1-s bucket (by submit time) from
  which on every bucket's p99 is within twice the p99 of the time before the hold (and 5 ms).
* **Tail**: after the producer stops, up to ``tail`` seconds for the backlog to be done.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.peers.common import StampReceiver, percentile, say

TICK = 0.01
WINDOW = 10.0


@dataclass
class System:
    name: str
    start: Callable[[], Awaitable[None]]
    submit: Callable[[list[str]], Awaitable[None]]  # one task per key
    size: Callable[[], Awaitable[int]]
    stop: Callable[[], Awaitable[None]]
    hold_url: str | None = None  # postgresql://… or sqlite:///path, for the hold
    #: a count the store keeps of its checkpoints (PostgreSQL's pg_stat_bgwriter), sampled
    #: every second: when one began, to hold the slow seconds against; None: not known
    checkpoints: Callable[[], Awaitable[int]] | None = None


@dataclass
class Plan:
    rate: float = 1_000.0
    duration: float = 600.0
    hold: bool = False
    hold_from: float = 0.2
    hold_to: float = 0.7
    tail: float = 60.0


@contextlib.asynccontextmanager
async def held_back(url: str) -> AsyncIterator[str]:
    """A session that keeps cleanup from going past the moment it began."""
    if url.startswith("postgresql"):
        import psycopg

        conn = await psycopg.AsyncConnection.connect(url)
        cur = await conn.execute("SELECT txid_current()")  # psycopg has begun a transaction
        row = await cur.fetchone()
        try:
            yield f"idle in transaction, txid {row[0] if row else '?'}"
        finally:
            await conn.rollback()
            await conn.close()
    else:
        path = url.removeprefix("sqlite:///")
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN")
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        try:
            yield f"SQLite read transaction open ({tables[0]} schema rows read)"
        finally:
            conn.execute("ROLLBACK")
            conn.close()


async def produce(system: System, plan: Plan, t0: float, submits: list[float]) -> None:
    """Submit at the plan's rate until its duration is up; *submits* gets each task's offset."""
    while True:
        now = time.time()
        if now >= t0 + plan.duration:
            return
        owed = int((now - t0) * plan.rate) - len(submits)
        if owed > 0:
            at = time.time() - t0
            first = len(submits)
            submits.extend([at] * owed)
            await system.submit([f"{first + i}@{at:.6f}" for i in range(owed)])
        await asyncio.sleep(max(0.0, TICK - (time.time() - now)))


async def watch_size(system: System, t0: float, every: float, out: list[dict[str, float]]) -> None:
    while True:
        out.append({"t": round(time.time() - t0, 1), "bytes": await system.size()})
        await asyncio.sleep(every)


async def watch_checkpoints(
    count: Callable[[], Awaitable[int]], t0: float, marks: dict[str, Any]
) -> None:
    """The seconds (since *t0*) at which the store's checkpoint count went up."""
    last = await count()
    seen: list[float] = marks.setdefault("checkpoints_s", [])
    while True:
        await asyncio.sleep(1.0)
        now = await count()
        if now > last:
            seen.append(round(time.time() - t0, 1))
        last = now


async def hold_for(url: str, plan: Plan, t0: float, marks: dict[str, float]) -> None:
    await asyncio.sleep(max(0.0, t0 + plan.duration * plan.hold_from - time.time()))
    async with held_back(url) as what:
        marks["hold_began"] = round(time.time() - t0, 2)
        say(f"  {marks['hold_began']:.0f}s: cleanup held back ({what})")
        await asyncio.sleep(max(0.0, t0 + plan.duration * plan.hold_to - time.time()))
    marks["hold_ended"] = round(time.time() - t0, 2)
    say(f"  {marks['hold_ended']:.0f}s: the holding session ended")


async def run(system: System, plan: Plan) -> dict[str, Any]:
    """One sustained run of *system*; its figures (see :func:`summarise`)."""
    submits: list[float] = []
    sizes: list[dict[str, float]] = []
    marks: dict[str, Any] = {}
    async with StampReceiver() as stamps:
        await system.start()
        t0 = time.time()
        background = [
            asyncio.create_task(watch_size(system, t0, max(2.0, plan.duration / 60), sizes)),
            asyncio.create_task(_progress(stamps, submits, t0, plan)),
        ]
        if system.checkpoints is not None:
            background.append(asyncio.create_task(watch_checkpoints(system.checkpoints, t0, marks)))
        holder = None
        if plan.hold and system.hold_url:
            holder = asyncio.create_task(hold_for(system.hold_url, plan, t0, marks))
        try:
            await produce(system, plan, t0, submits)
            if holder is not None:
                await holder
            deadline = time.time() + plan.tail
            while len(stamps.stamps) < len(submits) and time.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            marks["tail_s"] = round(time.time() - (t0 + plan.duration), 2)
        finally:
            for task in [*background, *([holder] if holder else [])]:
                task.cancel()
            sizes.append({"t": round(time.time() - t0, 1), "bytes": await system.size()})
            await system.stop()
        started = [(float(k.split("@")[1]), v - t0) for k, v in stamps.stamps.items()]
    return summarise(system.name, plan, submits, started, sizes, marks)


async def _progress(stamps: StampReceiver, submits: list[float], t0: float, plan: Plan) -> None:
    while True:
        await asyncio.sleep(WINDOW)
        say(
            f"  {time.time() - t0:4.0f}s / {plan.duration:.0f}s: submitted {len(submits):,}, "
            f"started {len(stamps.stamps):,}"
        )


def summarise(
    name: str,
    plan: Plan,
    submits: list[float],
    started: list[tuple[float, float]],
    sizes: list[dict[str, float]],
    marks: dict[str, float],
) -> dict[str, Any]:
    """Per-window figures; *started* holds (submit offset, start offset) per started task."""
    lat = sorted((sub, (st - sub) * 1000) for sub, st in started)
    count = int(plan.duration // WINDOW)
    by_window: list[list[float]] = [[] for _ in range(count)]
    for sub, ms in lat:
        if int(sub // WINDOW) < count:
            by_window[int(sub // WINDOW)].append(ms)
    offered = [0] * count
    for sub in submits:
        if int(sub // WINDOW) < count:
            offered[int(sub // WINDOW)] += 1
    windows = [
        {"t": w * WINDOW, "submitted": offered[w], "not_started": offered[w] - len(ms),
         "p50_ms": _p(ms, 50), "p99_ms": _p(ms, 99), "max_ms": _p(ms, 100)}
        for w, ms in enumerate(by_window)
    ]  # fmt: skip
    everything = [x for _, x in lat]
    by_second: list[list[float]] = [[] for _ in range(int(plan.duration))]
    for sub, ms in lat:
        if int(sub) < len(by_second):
            by_second[int(sub)].append(ms)
    out: dict[str, Any] = {
        "system": name,
        "rate": plan.rate,
        "duration_s": plan.duration,
        "hold": plan.hold,
        "submitted": len(submits),
        "done": len(started),
        "p50_ms": _p(everything, 50),
        "p99_ms": _p(everything, 99),
        "windows": windows,
        # [p50, p99] of each second, by submit time: where a window's tail comes from
        "seconds": [[_p(ms, 50), _p(ms, 99)] for ms in by_second],
        "sizes": sizes,
        **marks,
    }
    if "hold_began" in marks and "hold_ended" in marks:
        began, ended = marks["hold_began"], marks["hold_ended"]
        out["before_hold_p99_ms"] = _p([x for s, x in lat if 2.0 <= s < began], 99)
        out["hold_p99_ms"] = _p([x for s, x in lat if began <= s < ended], 99)
        out["after_hold_p99_ms"] = _p([x for s, x in lat if s >= ended], 99)
        out["recovery_s"] = recovery(lat, began, ended, plan.duration)
        out["settled_s"] = settled(lat, began, ended, plan.duration)
        out["slow_seconds"] = slow_seconds(lat, began, ended, plan.duration)
    return out


def _p(values: list[float], q: float) -> float | None:
    return round(percentile(values, min(q, 99.999)), 2) if values else None


def normal_limit(lat: list[tuple[float, float]], began: float) -> float | None:
    """The p99 a 1-s bucket or a window may have and still be normal: twice the p99 before the
    hold *began*, and at least 5 ms above it (the first 2 s warm up); None without data."""
    base = [x for s, x in lat if 2.0 <= s < began]
    if not base:
        return None
    p99 = percentile(base, 99)
    return max(2 * p99, p99 + 5.0)


def recovery(
    lat: list[tuple[float, float]], began: float, ended: float, duration: float
) -> float | None:
    """Seconds after *ended* until every later 1-s bucket's p99 is back near the p99 before
    the hold (at most twice it, and at most 5 ms above it); None if it never gets there."""
    limit = normal_limit(lat, began)
    if limit is None:
        return None
    buckets: dict[int, list[float]] = {}
    for s, x in lat:
        if s >= ended:
            buckets.setdefault(int(s - ended), []).append(x)
    good_from = None
    for b in range(int(duration - ended)):
        if b in buckets and percentile(buckets[b], 99) <= limit:
            good_from = b if good_from is None else good_from
        else:
            good_from = None
    return float(good_from) if good_from is not None else None


def settled(
    lat: list[tuple[float, float]], began: float, ended: float, duration: float
) -> float | None:
    """Seconds after *ended* until a 10-s window (the issue's and the tables' grain) has its
    p99 back within the limit ``recovery`` uses: the first whole second from which the next
    10 s are normal again, whatever comes later (a slow second 30 s on, which came every
    35 s before the hold too, is not the hold's). None if no such window before the end."""
    limit = normal_limit(lat, began)
    if limit is None:
        return None
    after = sorted((s - ended, x) for s, x in lat if s >= ended)
    at = [s for s, _ in after]
    for b in range(int(duration - ended) - 9):
        window = [x for _, x in after[bisect.bisect_left(at, b) : bisect.bisect_left(at, b + 10)]]
        if window and percentile(window, 99) <= limit:
            return float(b)
    return None


def slow_seconds(
    lat: list[tuple[float, float]], began: float, ended: float, duration: float
) -> dict[str, list[int]] | None:
    """How many 1-s buckets before the hold and after it have a p99 over the limit that
    ``recovery`` uses, of how many: [over, buckets]. One slow second late in the run makes
    ``recovery`` long; this says whether such seconds are more common after the hold than
    before it, when nothing was held."""
    limit = normal_limit(lat, began)
    if limit is None:
        return None
    before: dict[int, list[float]] = {}
    after: dict[int, list[float]] = {}
    for s, x in lat:
        if 2.0 <= s < began:
            before.setdefault(int(s), []).append(x)
        elif ended <= s < duration:
            after.setdefault(int(s - ended), []).append(x)

    def count(buckets: dict[int, list[float]]) -> list[int]:
        over = sum(1 for xs in buckets.values() if percentile(xs, 99) > limit)
        return [over, len(buckets)]

    return {"before": count(before), "after": count(after)}


def plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=1_000.0, help="tasks per second")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of producing")
    parser.add_argument("--hold", action="store_true", help="hold back cleanup, 20%% to 70%%")
    parser.add_argument("--tail", type=float, default=60.0, help="seconds to wait for the rest")


def plan_of(args: argparse.Namespace) -> Plan:
    return Plan(rate=args.rate, duration=args.duration, hold=args.hold, tail=args.tail)
