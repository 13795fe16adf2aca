"""Sustained load: contend on PostgreSQL, SQLite and etcd, and PgQueuer, at a fixed rate.

``python -m benchmarks.sustained [--quick] [--rate 1000] [--duration 600]
[--cases contend-postgresql-async,contend-postgresql-sync,pgqueuer,contend-sqlite-async,contend-etcd-async]
[--concurrency 8] [--no-hold | --only-hold] [--no-write]``

Each case runs in a child process of its own (contend in the project's virtualenv, PgQueuer in
the bench one), once as it is and, where the store has something to hold back (PostgreSQL and
SQLite), once with cleanup held back from 20 % to 70 % of the run (see
:mod:`benchmarks.sustained.driver`). ``--quick``: 60 s per run and 20 s of tail instead of
10 minutes and 60 s. It prints progress every 10 s, then a table; writes the figures to
``docs/benchmarks-sustained.json``, a chart of the pickup latency per window to
``docs/sustained.svg`` and the ``sustained`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.common import ROOT, say
from benchmarks.peers.run import _commit, bench_python, loadavg

#: case -> (backend, body); "pgqueuer" is the peer
CASES = {
    "contend-postgresql-async": ("postgresql", "async"),
    "contend-postgresql-sync": ("postgresql", "sync"),
    "pgqueuer": ("postgresql", "async"),
    "contend-sqlite-async": ("sqlite", "async"),
    "contend-sqlite-sync": ("sqlite", "sync"),
    "contend-etcd-async": ("etcd", "async"),
    "contend-etcd-sync": ("etcd", "sync"),
}
DEFAULT_CASES = "contend-postgresql-async,contend-postgresql-sync,pgqueuer,contend-sqlite-async,contend-etcd-async"


def command(
    case: str, hold: bool, args: argparse.Namespace, etcd: Any
) -> tuple[list[str], dict[str, str]]:
    backend, body = CASES[case]
    plan = ["--rate", str(args.rate), "--duration", str(args.duration), "--tail", str(args.tail)]
    plan += ["--hold"] if hold else []
    if case == "pgqueuer":
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return [args.peer_python, "-m", "benchmarks.sustained.pgqueuer_load", *plan], env
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, "-m", "benchmarks.sustained.contend_load", backend, "--body", body,
           "--concurrency", str(args.concurrency), *plan]  # fmt: skip
    if backend == "etcd":
        cmd += ["--etcd", f"{etcd.url}/load{time.monotonic_ns()}?max_txn_ops=1024"]
    return cmd, env


def one(case: str, hold: bool, args: argparse.Namespace, etcd: Any) -> dict[str, Any]:
    cmd, env = command(case, hold, args, etcd)
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
        timeout=args.duration + args.tail + 600,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{case} failed (exit {done.returncode}); its output is above")
    result = dict(json.loads(lines[-1]))
    result["case"] = case
    return result


def line(r: dict[str, Any]) -> str:
    worst = max((w["p99_ms"] or 0 for w in r["windows"]), default=0)
    text = (
        f"{r['system']}{' (held back)' if r['hold'] else ''}: {r['done']:,} of "
        f"{r['submitted']:,} done; pickup p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, worst "
        f"window p99 {worst:,.1f} ms"
    )
    if r["hold"] and "hold_p99_ms" in r:
        text += f"; p99 while held {r['hold_p99_ms']} ms, recovery {r.get('recovery_s')} s"
    return text


def run(args: argparse.Namespace) -> dict[str, Any]:
    from contend.cli.bench import machine_speed

    runs = [
        (c, h)
        for c in args.cases
        for h in (False, True)
        if (not h and not args.only_hold) or (h and args.hold and CASES[c][0] != "etcd")
    ]
    meta: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "rate": args.rate,
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "quick": args.quick,
        "machine_json_per_s_before": machine_speed(),
        "loadavg_before": loadavg(),
    }
    say(
        f"sustained load: {len(runs)} runs of {args.duration:.0f}s at {args.rate:,.0f} tasks/s; "
        f"machine speed {meta['machine_json_per_s_before']:,}, load average {meta['loadavg_before']}"
    )
    etcd = None
    if any(CASES[c][0] == "etcd" for c, _ in runs):
        from contend.testing.etcd_server import EtcdServer

        etcd = EtcdServer(extra_args=["--max-txn-ops=1024"])
        etcd.start()
    results = []
    try:
        for i, (case, hold) in enumerate(runs, 1):
            say(f"[{i}/{len(runs)}] {case}{', cleanup held back 20%-70%' if hold else ''}")
            results.append(one(case, hold, args, etcd))
            results[-1].update(commit=meta["commit"], measured_at=meta["measured_at"])
            say("  " + line(results[-1]))
    finally:
        if etcd is not None:
            etcd.close()
    meta["machine_json_per_s_after"] = machine_speed()
    meta["loadavg_after"] = loadavg()
    return {**meta, "results": results}


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """*new*'s meta and runs, after *old*'s runs of the (case, hold) pairs *new* did not run,
    each run keeping the commit and time it was measured at."""
    ran = {(r["case"], r["hold"]) for r in new["results"]}
    kept = [
        {"commit": old.get("commit"), "measured_at": old.get("measured_at"), **r}
        for r in old.get("results", [])
        if (r.get("case"), r["hold"]) not in ran
    ]
    order = {c: n for n, c in enumerate(CASES)}
    runs = sorted(kept + new["results"], key=lambda r: (order.get(r.get("case"), 99), r["hold"]))
    return {**new, "results": runs}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sustained")
    parser.add_argument("--quick", action="store_true", help="60 s per run, 20 s tail")
    parser.add_argument("--rate", type=float, default=1_000.0)
    parser.add_argument("--duration", type=float)
    parser.add_argument("--tail", type=float)
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"of {', '.join(CASES)}")
    parser.add_argument("--concurrency", type=int, default=8, help="each contend expert's")
    parser.add_argument("--no-hold", dest="hold", action="store_false", help="no held-back runs")
    parser.add_argument(
        "--only-hold", action="store_true", help="only the held-back runs (with --merge)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-sustained.json")
    parser.add_argument("--md", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--svg", type=Path, default=ROOT / "docs" / "sustained.svg")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the written runs of other cases (and holds), replacing only those run now",
    )
    args = parser.parse_args()
    args.duration = args.duration or (60.0 if args.quick else 600.0)
    args.tail = args.tail if args.tail is not None else (20.0 if args.quick else 60.0)
    args.cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in args.cases if c not in CASES]
    if bad:
        parser.error(f"unknown case: {', '.join(bad)}")
    args.peer_python = bench_python()  # PgQueuer, and matplotlib for the chart
    summary = run(args)
    from benchmarks.sustained.report import print_table, write

    if args.merge and args.out.exists():
        summary = merged(json.loads(args.out.read_text()), summary)
    print_table(summary)
    if not args.no_write:
        write(summary, args.out, args.md, args.svg, args.peer_python)
        say(f"wrote {args.out}, {args.svg} and the sustained section of {args.md}")
    return 0
