"""Shares: how evenly four experts split the work, at the default settings.

``python -m benchmarks.shares [--backends sqlite,postgresql,etcd] [--runs 3] [--experts 4]
[--cases ...] [--no-write] [--merge] [--quick]``
measures issue 14's fairness line ("with 4 experts, none gets less than half its share"). Per
backend, on a fresh store, four ``contend expert`` processes (concurrency 8, every other
setting its default) start and register; then one of these loads falls on them:

- ``burst``: N no-op tasks (sync and async bodies) submitted to fall due at one moment, after
  all four are live, drained to the end: 20,000 (under a second on SQLite) and 100,000;
- ``steady``: a producer submitting 1,000 tasks a second for 20 s, each sleeping 1 ms.

Each expert process counts the bodies it ran (``benchmarks/shares_app.py``). A *share* is an
expert's count over the fair quarter of the total: 1.00 is exactly even, 0.50 is the issue's
floor. Printed and written to ``docs/shares.json`` and a section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import commit
from benchmarks.fair_share import backend
from benchmarks.recovery import processes, until
from benchmarks.shares_app import app
from contend.store.port import Store
from contend.store.registry import open_store

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.shares_app:app"
#: how many experts share the work (--experts)
EXPERTS = 4
BATCH = 1_000
#: name -> (task type, tasks, rate a second or None for a burst)
CASES: dict[str, tuple[str, int, float | None]] = {
    "burst-20k-sync": ("noop_sync", 20_000, None),
    "burst-20k-async": ("noop_async", 20_000, None),
    "burst-100k-sync": ("noop_sync", 100_000, None),
    "burst-100k-async": ("noop_async", 100_000, None),
    "steady-1000": ("sleep_async", 20_000, 1_000.0),
}


async def submit(store: Store, task: str, n: int, due: float) -> None:
    """*n* tasks in batches, each falling due at *due* (``time.monotonic()``)."""
    for lo in range(0, n, BATCH):
        k = min(n, lo + BATCH)
        delay = max(0.0, due - time.monotonic())
        await store.submit([app.build_spec(task, [i], delay=delay) for i in range(lo, k)])


async def produce(store: Store, task: str, n: int, rate: float) -> None:
    """*n* tasks at *rate* a second, in submissions of ten (one per 10 ms)."""
    start = time.monotonic()
    for lo in range(0, n, 10):
        await asyncio.sleep(max(0.0, start + lo / rate - time.monotonic()))
        await store.submit([app.build_spec(task, [i]) for i in range(lo, min(n, lo + 10))])


async def succeeded(store: Store) -> int:
    return sum(q.get("succeeded", 0) for q in (await store.stats()).counts.values())


async def one(url: str, case: str, tmp: Path) -> dict[str, Any]:
    """One run of *case* on the fresh store at *url*: each expert's share."""
    task, n, rate = CASES[case]
    out_dir = tmp / f"counts-{time.monotonic_ns()}"
    out_dir.mkdir()
    os.environ["CONTEND_SHARES_DIR"] = str(out_dir)  # processes() hands it on
    base = [sys.executable, "-m", "contend", "expert", APP, "--store", url]
    cmds = [[*base, "--name", f"e{k}"] for k in range(EXPERTS)]
    store = await open_store(url)
    try:
        with processes(cmds, tmp) as procs:

            async def live() -> bool:
                return sum(e.alive for e in await store.list_experts()) >= EXPERTS

            await until(live, 60, "four live experts")
            began = time.monotonic()
            if rate is None:
                # all due at one moment once the whole burst is in: a batch of the same size
                # to a queue no expert serves tells how long submitting takes here
                t0 = time.monotonic()
                probe = [app.build_spec(task, [0], queue="probe") for _ in range(BATCH)]
                await store.submit(probe)
                lead = 0.5 + 1.5 * (time.monotonic() - t0) * -(-n // BATCH)
                t0 = time.monotonic()
                await submit(store, task, n, due=t0 + lead)
                if time.monotonic() > t0 + lead:
                    print(f"      (submitting took {time.monotonic() - t0:.1f} s, over {lead:.1f})")
                began = t0 + lead  # the drain's time, from the moment all fell due
            else:
                await produce(store, task, n, rate)

            async def done() -> bool:
                return await succeeded(store) >= n

            await until(done, 600, f"{n:,} tasks to succeed")
            wall = time.monotonic() - began
            for p in procs:  # one signal: they drain and leave, and write their counts
                p.send_signal(signal.SIGTERM)
            for p in procs:
                await asyncio.to_thread(p.wait, 60)
    finally:
        await store.close()
    counts, timelines = [], []
    for p in procs:
        f = out_dir / f"{p.pid}.json"
        got = json.loads(f.read_text()) if f.exists() else {"tasks": 0, "tenths": {}}
        counts.append(got["tasks"])
        timelines.append({int(k): v for k, v in got["tenths"].items()})
    total = sum(counts)
    if total != n:
        # what the experts logged tells why (a lost lease: its runs' commits were refused)
        said = [
            f"  expert {k}: {line}"
            for k in range(EXPERTS)
            if (tmp / f"proc-{k}.log").exists()
            for line in (tmp / f"proc-{k}.log").read_text(errors="replace").splitlines()
            if "WARNING" in line or "ERROR" in line
        ]
        raise RuntimeError(
            f"{case}: the experts counted {total:,} runs of {n:,} tasks "
            f"({', '.join(map(str, counts))})\n" + "\n".join(said[-40:])
        )
    shares = sorted(c * EXPERTS / n for c in counts)
    if os.environ.get("SHARES_TIMELINE"):
        lo = min((min(t) for t in timelines if t), default=0)
        hi = max((max(t) for t in timelines if t), default=0)
        for k in range(lo, hi + 1):
            print(f"      {(k - lo) / 10:5.1f} " + " ".join(f"{t.get(k, 0):6d}" for t in timelines))
    return {"shares": shares, "counts": counts, "seconds": wall}


async def measure(name: str, runs: int, cases: list[str], tmp: Path) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for case in cases:
        got[case] = []
        for r in range(runs):
            where = tmp / f"store-{time.monotonic_ns()}"  # a fresh SQLite file each run
            where.mkdir()
            async with backend(name, where) as url:
                res = await one(url, case, tmp)
            got[case].append(res)
            print(
                f"  {name} {case} run {r + 1}: shares "
                + " ".join(f"{s:.2f}" for s in res["shares"])
                + f" ({res['seconds']:.1f} s)",
                flush=True,
            )
    return got


def table(name: str, got: dict[str, Any]) -> str:
    lines = [
        f"| {name} | smallest share, each run | median of the smallest | largest share, each run |",
        "|---|---|---|---|",
    ]
    for case, rs in got.items():
        small = [r["shares"][0] for r in rs]
        large = [r["shares"][-1] for r in rs]
        lines.append(
            f"| {case} | {' '.join(f'{s:.2f}' for s in small)} | "
            f"{statistics.median(small):.2f} | {' '.join(f'{s:.2f}' for s in large)} |"
        )
    return "\n".join(lines)


def merged(
    results: dict[str, Any], measured: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """*results* with the other backends' figures of docs/shares.json before them, and when
    each backend was measured."""
    path = ROOT / "docs" / "shares.json"
    if not path.exists():
        return results, measured
    old = json.loads(path.read_text())
    before = old["meta"]
    when = before.get("measured") or {
        name: {"date": before["date"], "commit": before["commit"]} for name in old["results"]
    }
    keep = {k: v for k, v in old["results"].items() if k not in results}
    return {**keep, **results}, {**{k: when[k] for k in keep}, **measured}


def write(results: dict[str, Any], meta: dict[str, Any]) -> None:
    (ROOT / "docs" / "shares.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1) + "\n"
    )
    body = [
        "<!-- begin shares -->",
        "## Shares among four experts",
        "",
        f"`python -m benchmarks.shares`, {meta['date']}, commit {meta['commit']}, "
        f"{meta['machine']}. Issue 14: with four experts none gets less than half its share. "
        "Four `contend expert` processes at the default settings (concurrency 8) on one fresh "
        "store per run; a burst is submitted to fall due at one moment after all four are "
        "live, the steady case is a producer at 1,000 tasks a second of 1 ms each. A share is "
        "an expert's runs over a quarter of the total (1.00: even; the floor is 0.50). "
        f"{meta['runs']} runs per case. Every count is in docs/shares.json.",
        "",
    ]
    measured = meta.get("measured", {})
    for name, got in results.items():
        if name in measured and measured[name]["commit"] != meta["commit"]:
            m = measured[name]
            body += [f"{name}: measured {m['date']} at commit {m['commit']}.", ""]
        body += [table(name, got), ""]
    body.append("<!-- end shares -->")
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text()
    section = "\n".join(body)
    if "<!-- begin shares -->" in text:
        head, rest = text.split("<!-- begin shares -->", 1)
        _, tail = rest.split("<!-- end shares -->", 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


async def main(argv: list[str] | None = None) -> int:
    global EXPERTS
    p = argparse.ArgumentParser(prog="python -m benchmarks.shares", description=__doc__)
    p.add_argument("--backends", default="sqlite,postgresql,etcd")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    p.add_argument("--experts", type=int, default=EXPERTS, help="how many (default 4)")
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other backends' figures in docs/shares.json (each with its own date)",
    )
    p.add_argument("--quick", action="store_true", help="one run of the 20k bursts; no file")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.no_write = 1, True
        args.cases = "burst-20k-sync,burst-20k-async"
    EXPERTS = args.experts
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            raise SystemExit(f"unknown case {c!r}; the cases are: {', '.join(CASES)}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="contend-shares-") as t:
        for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
            results[name] = await measure(name, args.runs, cases, Path(t))
            print(table(name, results[name]), flush=True)
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": f"{platform.node() or 'host'} ({os.cpu_count()} cores)",
        "runs": args.runs,
    }
    if not args.no_write:
        measured = {name: {"date": meta["date"], "commit": meta["commit"]} for name in results}
        if args.merge:
            results, measured = merged(results, measured)
        write(results, {**meta, "measured": measured})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
