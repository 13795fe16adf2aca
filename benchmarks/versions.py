"""Two versions of contend side by side in one run, on any backend: drain rate, CPU per task and
idle submit-to-start latency.

``python -m benchmarks.versions REV --backend sqlite|postgresql|etcd [--runs 3] [--tasks 20000]
[--concurrency 512] [--body async|sync]``
checks REV out into a temporary worktree and measures it and this checkout in turn, RUNS times
each, alternating, so that both meet the same moods of a machine whose speed swings two- to
threefold within an hour. Each measurement is one child process whose ``PYTHONPATH`` is that
version's ``src/``; the expert processes it starts inherit it, so they run that version too.
A child drains with the version's own ``contend bench`` part (``Bench.drain`` with two expert
processes), so each version is measured by the code it shipped with; the latency probe is the
one thing both share, since the versions' own probes started their clocks at different moments.

Per run it prints the drain rate, the experts' CPU per drained task (user + system of the
expert processes from ``/proc`` while the drain runs, start-up left out), the store server's
CPU per task over the same span (the PostgreSQL backends of the bench database, or the etcd
server; none for SQLite) and the idle latency p50/p99 (submit call to the task's first line, by
one probe for both versions: ``benchmarks/versions_probe.py``); then the medians, the ratios of the
medians new/old, and the median of the ratios within each pair (the two versions take turns
going first). ``--out FILE`` also writes them as JSON.

The stores: SQLite files in a temporary folder; a fresh PostgreSQL database per measurement
(``CONTEND_TEST_PG`` or 127.0.0.1:5432); a throwaway etcd 3.5 with a prefix per version.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.peers.common import CpuMeter, pg_backend_pids

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("drain_per_s", "experts_us", "server_us", "latency_p50_ms", "latency_p99_ms")
#: The pid of the etcd server a child measures against, set by the parent.
SERVER_PID_ENV = "CONTEND_VERSIONS_SERVER_PID"


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    url: str | None, n: int, concurrency: int, latency: bool, body: str = "async"
) -> dict[str, Any]:
    """One measurement with the contend on sys.path (the child's version)."""
    from contend.cli.bench import Bench

    bench = Bench(
        argparse.Namespace(quick=False, tasks=n, concurrency=concurrency, store=url, body=body)
    )
    # an older version's Bench leaves its temporary folder (SQLite files, tens of MB) behind
    atexit.register(shutil.rmtree, bench.tmp, ignore_errors=True)
    if latency:
        # one probe for both versions (benchmarks/versions_probe.py): each version's own
        # Bench.latency timed from a different moment
        from benchmarks import versions_probe

        p50, p99 = await versions_probe.latency(bench)
    # The experts' CPU from the moment the tasks fall due to the last one done (Bench.drain
    # calls wait_done then), read from /proc: their start-up, which differs between versions
    # that import different modules, stays out of it.
    procs: list[Any] = []
    cpu: list[float] = []
    server: list[float] = []
    start_experts, wait_done = bench.experts, bench.wait_done
    meter = CpuMeter(lambda: _server_pids(url))

    async def experts(*args: Any, **kw: Any) -> Any:
        procs[:] = await start_experts(*args, **kw)
        return procs

    async def timed_wait(*args: Any, **kw: Any) -> None:
        before = sum(_cpu_seconds(p.pid) for p in procs)
        meter.start()
        await wait_done(*args, **kw)
        cpu.append(sum(_cpu_seconds(p.pid) for p in procs) - before)
        server.append(meter.stop())

    bench.experts, bench.wait_done = experts, timed_wait  # type: ignore[method-assign]
    await bench.drain(2)
    out: dict[str, Any] = {
        "drain_per_s": bench.results["drain_2p_per_s"],
        "experts_us": cpu[0] * 1e6 / n,
        "server_us": server[0] * 1e6 / n,
    }
    if latency:
        out["latency_p50_ms"] = round(p50, 2)
        out["latency_p99_ms"] = round(p99, 2)
    return out


async def child(
    backend: str, url: str, n: int, concurrency: int, latency: bool, body: str
) -> dict[str, Any]:
    if backend == "postgresql":
        from contend.testing.postgres import fresh_database

        async with fresh_database() as db_url:
            return await measure(db_url, n, concurrency, latency, body)
    return await measure(url or None, n, concurrency, latency, body)


def _server_pids(url: str | None) -> list[int]:
    """The store's server processes on this host: the PostgreSQL backends of the bench
    database (the bench's own count poll among them, alike for both versions), the etcd
    server; none for SQLite."""
    if url and url.startswith("postgresql"):
        return pg_backend_pids(url)
    pid = os.environ.get(SERVER_PID_ENV)
    return [int(pid)] if pid and os.path.exists(f"/proc/{pid}") else []


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def _line(label: str, r: dict[str, Any]) -> str:
    text = f"{r['drain_per_s']:,.0f} tasks/s, experts {r['experts_us']:.0f} µs/task"
    if r.get("server_us") is not None:
        text += f" + server {r['server_us']:.0f}"
    if "latency_p50_ms" in r:
        text += f", idle latency p50 {r['latency_p50_ms']:.2f} ms p99 {r['latency_p99_ms']:.2f} ms"
    return f"{label}: {text}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="contend-versions-"))
    old = work / "old"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.rev],
        check=True,
        capture_output=True,
    )
    server = None
    base = ""
    if args.backend == "etcd":
        from contend.testing.etcd_server import EtcdServer

        server = EtcdServer(extra_args=["--max-txn-ops=1024"])
        server.start()
        base = server.url
    results: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    try:
        for n_run in range(args.runs):
            pair = [("old", old / "src"), ("new", ROOT / "src")]
            # each goes first in every other pair: the second of a pair meets the first's
            # after-effects (PostgreSQL's checkpoint and autovacuum of the run before)
            for label, src in pair if n_run % 2 == 0 else pair[::-1]:
                url = f"{base}/{label}{n_run}?max_txn_ops=1024" if base else ""
                env = {**os.environ, "PYTHONPATH": str(src)}
                if server is not None and server.proc is not None:
                    env[SERVER_PID_ENV] = str(server.proc.pid)
                cmd = [sys.executable, "-m", "benchmarks.versions", args.rev,
                       "--backend", args.backend, "--tasks", str(args.tasks),
                       "--concurrency", str(args.concurrency), "--body", args.body,
                       "--child", url]  # fmt: skip
                if args.no_latency:
                    cmd.append("--no-latency")
                done = subprocess.run(
                    cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False
                )
                if done.returncode != 0:
                    raise RuntimeError(f"the {label} run failed:\n{done.stderr[-3000:]}")
                r = json.loads(done.stdout.strip().splitlines()[-1])
                results[label].append(r)
                who = args.rev if label == "old" else "this checkout"
                print(f"run {n_run + 1} {_line(f'{label} ({who})', r)}", flush=True)
    finally:
        if server is not None:
            server.close()
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(work, ignore_errors=True)  # the folder the worktree was in
    med = {label: {k: _median(rows, k) for k in KEYS} for label, rows in results.items()}
    ratio = {
        k: (med["new"][k] / med["old"][k]) if med["old"][k] and med["new"][k] else None
        for k in KEYS
    }
    # the ratio within each pair, whose two runs met about the same machine: steadier than the
    # ratio of medians when the machine's speed drifts over the run
    pairs = {
        k: [
            n[k] / o[k]
            for o, n in zip(results["old"], results["new"], strict=True)
            if o.get(k) and n.get(k)
        ]
        for k in KEYS
    }
    paired = {k: statistics.median(v) if v else None for k, v in pairs.items()}
    summary = {"rev": args.rev, "backend": args.backend, "tasks": args.tasks, "runs": results}
    summary |= {"median": med, "ratio_new_over_old": ratio, "median_pair_ratio": paired}
    print(f"median old: {_line(args.rev, {k: v for k, v in med['old'].items() if v is not None})}")
    print(
        f"median new: {_line('this checkout', {k: v for k, v in med['new'].items() if v is not None})}"
    )
    print("ratios new/old: " + ", ".join(f"{k} x{v:.2f}" for k, v in ratio.items() if v))
    print(
        "pair ratios new/old (median; each pair): "
        + ", ".join(
            f"{k} x{paired[k]:.2f} ({' '.join(f'{r:.2f}' for r in pairs[k])})"
            for k in KEYS
            if paired[k]
        )
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.versions")
    parser.add_argument("rev", help="the git revision to compare this checkout with")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "etcd"], default="sqlite")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--no-latency", action="store_true", help="measure the drain only")
    parser.add_argument("--body", choices=["async", "sync"], default="async", help="task bodies")
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        figures = asyncio.run(
            child(
                args.backend,
                args.child,
                args.tasks,
                args.concurrency,
                not args.no_latency,
                args.body,
            )
        )
        print(json.dumps(figures), flush=True)
        return 0
    summary = run(args)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
