"""contend against PgQueuer, Procrastinate and Huey: same machine, same run, alternating.

``python -m benchmarks.peers [--quick] [--runs 3] [--tasks 10000] [--backends sqlite,postgresql]
[--peers pgqueuer,procrastinate,huey-sqlite,huey-redis] [--no-write]``

Each repetition measures every system once, each in a child process of its own, contend
shapes and peers taking turns (contend, peer, contend, peer, …; the order reversed on every
other repetition), so that all of them meet the same moods of this shared machine. contend
runs in the project's virtualenv, from this checkout; the peers in the throwaway one that
``scripts/bench-venv.sh`` makes. The contend shapes, per backend: sync and async bodies, each
at the default shape (2 expert processes × the default concurrency, 8) and at the tuned one
(2 × 32 on SQLite, 2 × 64 on PostgreSQL, 2 × 512 on etcd). The peers are grouped with the
backend they are compared with: PgQueuer and Procrastinate with PostgreSQL, Huey (SQLite and
Redis) with SQLite.

It prints each measurement, then the medians and the ratios contend/peer, and writes them to
``docs/benchmarks-peers.json`` and to the ``peers`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.peers.common import ROOT, say
from benchmarks.peers.peer_systems import BACKEND, PEERS

DEFAULT_CONCURRENCY = 8
TUNED = {"sqlite": 32, "postgresql": 64, "etcd": 512}
#: which contend backend each peer is compared with
GROUP = {"pgqueuer": "postgresql", "procrastinate": "postgresql"} | {
    "huey-sqlite": "sqlite",
    "huey-redis": "sqlite",
}
KEYS = ("drain_per_s", "cpu_us", "workers_us", "server_us", "latency_p50_ms", "latency_p99_ms",
        "submit_call_p50_ms")  # fmt: skip


@dataclass
class System:
    label: str
    kind: str  # "contend" or a peer's name
    backend: str
    body: str = "async"
    concurrency: int = DEFAULT_CONCURRENCY
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def shape(self) -> str:
        if self.kind == "contend":
            tuned = "tuned" if self.concurrency != DEFAULT_CONCURRENCY else "default"
            return f"{self.body} body, 2 × {self.concurrency} ({tuned})"
        return {"pgqueuer": "async body, 2 workers", "procrastinate": "async body, 2 workers"}.get(
            self.kind, "sync body, 2 worker processes"
        )

    def median(self, key: str) -> float | None:
        values = [r[key] for r in self.runs if r.get(key) is not None]
        return statistics.median(values) if values else None


def systems(backends: list[str], peers: list[str]) -> list[System]:
    """Every system, contend shapes and peers of one backend taking turns."""
    out: list[System] = []
    for backend in backends:
        shapes = [
            System(f"contend {backend} {body} 2×{c}", "contend", backend, body, c)
            for c in (DEFAULT_CONCURRENCY, TUNED[backend])
            for body in ("sync", "async")
        ]
        rivals = [System(p, p, BACKEND[p]) for p in peers if GROUP[p] == backend]
        while shapes or rivals:
            if shapes:
                out.append(shapes.pop(0))
            if rivals:
                out.append(rivals.pop(0))
    return out


def bench_python() -> str:
    made = subprocess.run(
        [str(ROOT / "scripts" / "bench-venv.sh")], check=True, capture_output=True, text=True
    )
    python = made.stdout.strip().splitlines()[-1]
    return python if os.path.isabs(python) else str(ROOT / python)


def measure(
    system: System, args: argparse.Namespace, peer_python: str, etcd: Any
) -> dict[str, Any]:
    samples = 100 if args.quick else 300
    if system.kind == "contend":
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        cmd = [sys.executable, "-m", "benchmarks.peers.contend_child", system.backend,
               "--body", system.body, "--concurrency", str(system.concurrency),
               "--tasks", str(args.tasks), "--samples", str(samples)]  # fmt: skip
        if etcd is not None:
            prefix = f"peers{time.monotonic_ns()}"
            cmd += [
                "--etcd",
                f"{etcd.url}/{prefix}?max_txn_ops=1024",
                "--etcd-pid",
                str(etcd.proc.pid),
            ]
    else:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [peer_python, "-m", "benchmarks.peers.peer_child", system.kind,
               "--tasks", str(args.tasks), "--samples", str(samples),
               "--drain-limit", str(args.drain_limit)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, timeout=1800)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{system.label} failed (exit {done.returncode}); its output is above")
    return dict(json.loads(lines[-1]))


def ratios(all_systems: list[System]) -> list[dict[str, Any]]:
    """contend/peer for every contend shape and every peer of its group (medians)."""
    out = []
    for c in (s for s in all_systems if s.kind == "contend"):
        for p in (s for s in all_systems if s.kind != "contend" and GROUP[s.kind] == c.backend):
            row: dict[str, Any] = {"contend": c.label, "peer": p.label}
            for key in ("drain_per_s", "cpu_us", "latency_p99_ms", "submit_call_p50_ms"):
                a, b = c.median(key), p.median(key)
                row[key] = round(a / b, 2) if a and b else None
            out.append(row)
    return out


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from contend.cli.bench import machine_speed

    peer_python = bench_python() if args.peers else ""
    todo = systems(args.backends, args.peers)
    meta: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "tasks": args.tasks,
        "runs": args.runs,
        "quick": args.quick,
        "machine_json_per_s_before": machine_speed(),
        "loadavg_before": loadavg(),
    }
    say(
        f"peers benchmark: {len(todo)} systems × {args.runs} run(s), {args.tasks:,} tasks per "
        f"drain; machine speed {meta['machine_json_per_s_before']:,} JSON round trips/s, load "
        f"average {meta['loadavg_before']}"
    )
    etcd = None
    if "etcd" in args.backends:
        from contend.testing.etcd_server import EtcdServer

        etcd = EtcdServer(extra_args=["--max-txn-ops=1024"])
        etcd.start()
    step, total = 0, len(todo) * args.runs
    try:
        for n_run in range(args.runs):
            for system in todo if n_run % 2 == 0 else list(reversed(todo)):
                step += 1
                say(f"[{step}/{total}] run {n_run + 1}: {system.label}")
                system.runs.append(
                    measure(system, args, peer_python, etcd if system.backend == "etcd" else None)
                )
    finally:
        if etcd is not None:
            etcd.close()
    meta["machine_json_per_s_after"] = machine_speed()
    meta["loadavg_after"] = loadavg()
    summary = {
        **meta,
        "systems": [
            {
                "label": s.label,
                "kind": s.kind,
                "backend": s.backend,
                "shape": s.shape,
                "median": {k: s.median(k) for k in KEYS},
                "runs": s.runs,
            }
            for s in todo
        ],
        "ratios": ratios(todo),
    }
    from benchmarks.peers.report import print_summary

    print_summary(summary)
    return summary


def _commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *a], capture_output=True, text=True
        ).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        " (with local changes)" if git("status", "--porcelain", "src") else ""
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers")
    parser.add_argument(
        "--quick", action="store_true", help="1 run, 5,000 tasks, 100 latency samples"
    )
    parser.add_argument("--runs", type=int)
    parser.add_argument("--tasks", type=int)
    parser.add_argument(
        "--backends", default="sqlite,postgresql", help="of sqlite, postgresql, etcd"
    )
    parser.add_argument("--peers", default=",".join(PEERS), help="'' for none")
    parser.add_argument("--drain-limit", type=float, default=60.0, help="seconds per peer drain")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-peers.json")
    parser.add_argument("--md", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    args.runs = args.runs or (1 if args.quick else 3)
    args.tasks = args.tasks or (5_000 if args.quick else 10_000)
    args.backends = [b for b in args.backends.split(",") if b]
    args.peers = [p for p in args.peers.split(",") if p]
    bad = [b for b in args.backends if b not in TUNED] + [p for p in args.peers if p not in PEERS]
    if bad:
        parser.error(f"unknown backend or peer: {', '.join(bad)}")
    args.peers = [p for p in args.peers if GROUP[p] in args.backends]
    summary = run(args)
    if not args.no_write:
        from benchmarks.peers.report import write

        write(summary, args.out, args.md)
        say(f"wrote {args.out} and the peers section of {args.md}")
    return 0
