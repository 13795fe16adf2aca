"""``contend demo --pipeline``: a million web-server log lines through extract → transform →
load into a SQLite table, on expert processes that each serve every stage; live progress per
stage, then a report that counts the rows, the rate of each stage and the peaks of backlog
and memory (``contend.demo.pipeline``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from typing import Any

from contend.demo import pipeline as demo
from contend.errors import ConfigError
from contend.store.port import Store
from contend.store.registry import open_store

#: Lines a chunk (one extract task).
CHUNK = 1000


def _say(text: str = "") -> None:
    print(text, flush=True)


async def run_pipeline_demo(args: argparse.Namespace) -> int:
    workdir = tempfile.mkdtemp(prefix="contend-pipeline-")
    url = args.store or f"sqlite:///{os.path.join(workdir, 'demo.db')}"
    sink = os.path.join(workdir, "requests.db")
    demo.open_sink(sink)
    store = await open_store(url)
    procs: list[asyncio.subprocess.Process] = []
    try:
        if sum(sum(q.values()) for q in (await store.stats()).counts.values()):
            raise ConfigError(f"the demo needs an empty store, and {url} already holds tasks")
        chunks = [[seed, CHUNK] for seed in range(args.lines // CHUNK)]
        lines = len(chunks) * CHUNK
        _say(
            f"pipeline weblog: {lines:,} log lines in {len(chunks):,} chunks, extract → "
            f"transform → load, {demo.BATCH:,} records a task, a stage waits while the queue "
            f"after it holds more than {demo.LIMIT} tasks"
        )
        started = time.monotonic()
        await store.submit(demo.logs.specs(chunks, batch=1))
        procs = [await _expert(url, sink, f"pipe-{n}", workdir) for n in range(args.experts)]
        _say(f"{args.experts} experts started (each serves every stage); store {url}")
        watch = await _watch(store, len(chunks), started, sys.stdout.isatty())
        peak_rss = [_peak_rss(p.pid) for p in procs]
        elapsed = time.monotonic() - started
        await _stop(procs)
        report = _report(sink, lines, elapsed, watch, peak_rss)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            _print(report)
        return 0 if report["ok"] else 1
    finally:
        await _stop(procs)
        await store.close()
        if args.store is None:
            shutil.rmtree(workdir, ignore_errors=True)


async def _expert(url: str, sink: str, name: str, workdir: str) -> asyncio.subprocess.Process:
    log = open(os.path.join(workdir, f"{name}.log"), "wb")  # noqa: SIM115, ASYNC230
    env = {**os.environ, "CONTEND_PIPELINE_SINK": sink}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "contend", "expert", "contend.demo.pipeline:app"),
        *("--store", url, "--name", name, "--concurrency", "4", "--lease", "5"),
        stdout=log,
        stderr=log,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    log.close()
    return proc


async def _watch(store: Store, chunks: int, started: float, tty: bool) -> dict[str, Any]:
    """Progress per stage until the last stage has done every chunk; the peaks seen."""
    stages = demo.logs.stages
    peaks = dict.fromkeys(stages, 0)
    done_at: dict[str, float] = {}
    last_print = 0.0
    while True:
        counts = (await store.stats()).counts
        now = time.monotonic() - started
        done = {s: counts.get(s, {}).get("succeeded", 0) for s in stages}
        for s in stages:
            peaks[s] = max(peaks[s], counts.get(s, {}).get("pending", 0))
            if done[s] >= chunks and s not in done_at:
                done_at[s] = now
        failed = sum(counts.get(s, {}).get("dead", 0) for s in stages)
        if now - last_print >= (0.5 if tty else 5.0) or done[stages[-1]] >= chunks:
            last_print = now
            parts = [
                f"{s.split('.')[-1]} {done[s]:>5}/{chunks} ({counts.get(s, {}).get('pending', 0):>3} waiting)"
                for s in stages
            ]
            records = done[stages[-1]] * demo.BATCH
            line = (
                f"  {now:6.1f}s  "
                + "  ".join(parts)
                + f"  {records / max(now, 1e-9):,.0f} records/s"
            )
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
        if done[stages[-1]] >= chunks or failed:
            if tty:
                print()
            return {"peaks": peaks, "done_at": done_at, "failed": failed}
        await asyncio.sleep(0.1)


def _peak_rss(pid: int) -> int | None:
    """The process's peak resident memory in bytes (Linux), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            p.terminate()
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), 30)
        except TimeoutError:
            p.kill()
            await p.wait()
    procs.clear()


def _report(
    sink: str, lines: int, elapsed: float, watch: dict[str, Any], rss: list[int | None]
) -> dict[str, Any]:
    db = sqlite3.connect(sink)
    rows, bots = db.execute("SELECT count(*), sum(bot) FROM requests").fetchone()
    by_class = dict(db.execute("SELECT class, count(*) FROM requests GROUP BY class ORDER BY 1"))
    db.close()
    done_at = watch["done_at"]
    finished = {s.split(".")[-1]: round(t, 2) for s, t in done_at.items()}
    return {
        "ok": rows == lines and not watch["failed"],
        "lines": lines,
        "rows_loaded": rows,
        "bots": bots,
        "status_classes": by_class,
        "seconds": round(elapsed, 2),
        "records_per_s": round(rows / elapsed),
        "stage_finished_after_s": finished,
        "peak_waiting_tasks": {s.split(".")[-1]: n for s, n in watch["peaks"].items()},
        "limit": demo.LIMIT,
        "peak_rss_mib": [None if r is None else round(r / 2**20) for r in rss],
        "failed": watch["failed"],
    }


def _print(r: dict[str, Any]) -> None:
    _say()
    _say("report")
    _say(f"  rows loaded     {r['rows_loaded']:,}/{r['lines']:,} lines")
    _say(f"  end to end      {r['records_per_s']:,} records/s over {r['seconds']:.1f}s")
    _say(
        "  stages          finished after "
        + ", ".join(f"{s} {v:.1f}s" for s, v in r["stage_finished_after_s"].items())
    )
    peaks = r["peak_waiting_tasks"]
    _say(
        "  back-pressure   most tasks waiting: "
        + ", ".join(f"{s} {n}" for s, n in peaks.items())
        + f" (limit {r['limit']} after the first stage)"
    )
    _say(
        "  memory          peak RSS per expert: " + ", ".join(f"{m} MiB" for m in r["peak_rss_mib"])
    )
    _say(f"  content         {r['status_classes']}, {r['bots']:,} bot requests")
    _say(f"  verdict         {'OK' if r['ok'] else 'PROBLEMS FOUND'}")
