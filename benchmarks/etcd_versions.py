"""Two versions of contend's etcd store, side by side in one run on one etcd.

``python -m benchmarks.etcd_versions REV [--runs 3] [--tasks 20000]`` checks REV out into a
temporary worktree, starts a throwaway etcd 3.5 (``--max-txn-ops=1024``), and drains N no-op
tasks with two expert processes (concurrency 512) of REV's code and of this checkout's, in
turn, RUNS times each. It prints each run's rate and the CPU the experts and etcd spent per
task, then the medians and their ratio. The machine this runs on changes speed from day to
day; alternating the two versions in one run is what makes their figures comparable.

Each drain runs in a child process whose ``PYTHONPATH`` is that version's ``src/``, so the
experts it starts run that version too; each version gets a prefix of its own (their
schemas may differ).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drain(url: str, n: int, processes: int, concurrency: int, etcd_pid: int) -> dict:
    """One drain with the contend on sys.path (the child's version); returns its figures."""
    from contend.cli.bench import Bench
    from contend.demo import bench_tasks as bt
    from contend.domain.task import TaskState
    from contend.store.registry import open_store

    store = await open_store(url)
    await store.purge_all()  # type: ignore[attr-defined]
    await store.compact_history()  # type: ignore[attr-defined]
    # The version's own `contend bench` starts and stops the experts (an API every version has).
    bench = Bench(argparse.Namespace(quick=False, tasks=n, concurrency=concurrency, store=url))
    procs = await bench.experts(url, processes)
    try:
        await bench.wait_live(store, processes, procs)
        lead = 0.5 + n / 2_000  # every task falls due after the submission is all in
        specs = [bt.app.build_spec(bt.noop, delay=lead) for _ in range(n)]
        await store.submit(specs)
        t0 = min([(await store.get(specs[i].id)).run_at for i in (0, -1)])
        if await store.now() >= t0:
            raise RuntimeError("the submission took longer than its lead")
        await asyncio.sleep(t0 - await store.now())
        experts0 = sum(_cpu_seconds(p.pid) for p in procs)
        etcd0 = _cpu_seconds(etcd_pid)
        # The same light wait for both versions (an earlier version's bench polled stats(),
        # which reads every task): an index count while tasks wait, stats() at the end.
        deadline = time.monotonic() + 600
        while True:
            if (await store.backlog(["default"])).pending == 0:
                counts = (await store.stats()).counts
                if sum(q.get("succeeded", 0) for q in counts.values()) >= n:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all {n} tasks done after 600 s")
            await asyncio.sleep(0.25)
        experts1 = sum(_cpu_seconds(p.pid) for p in procs)
        etcd1 = _cpu_seconds(etcd_pid)
        done = await store.list_tasks(state=TaskState.SUCCEEDED, limit=n)
        t1 = max(t.updated_at for t in done)
    finally:
        await Bench.stop(procs)
        await store.close()
        shutil.rmtree(bench.tmp, ignore_errors=True)
    return {
        "rate": n / (t1 - t0),
        "experts_us": (experts1 - experts0) * 1e6 / n,
        "etcd_us": (etcd1 - etcd0) * 1e6 / n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.etcd_versions")
    parser.add_argument("rev", help="the git revision to compare this checkout with")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--child", nargs=2, metavar=("URL", "ETCD_PID"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, pid = args.child
        figures = asyncio.run(drain(url, args.tasks, 2, 512, int(pid)))
        print(json.dumps(figures), flush=True)
        return 0

    from contend.testing.etcd_server import EtcdServer

    work = Path(tempfile.mkdtemp(prefix="contend-versions-"))
    old = work / "old"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.rev],
        check=True,
        capture_output=True,
    )
    server = EtcdServer(extra_args=["--max-txn-ops=1024"])
    server.start()
    assert server.proc is not None
    results: dict[str, list[dict]] = {"old": [], "new": []}
    try:
        for run in range(args.runs):
            for label, src in (("old", old / "src"), ("new", ROOT / "src")):
                url = f"{server.url}/{label}?max_txn_ops=1024"
                env = {**os.environ, "PYTHONPATH": str(src)}
                child = subprocess.run(
                    [sys.executable, "-m", "benchmarks.etcd_versions", args.rev,
                     "--tasks", str(args.tasks), "--child", url, str(server.proc.pid)],
                    cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                )  # fmt: skip
                if child.returncode != 0:
                    raise RuntimeError(f"the {label} drain failed:\n{child.stderr[-3000:]}")
                r = json.loads(child.stdout.strip().splitlines()[-1])
                results[label].append(r)
                print(
                    f"run {run + 1} {label} ({args.rev if label == 'old' else 'this checkout'}): "
                    f"{r['rate']:,.0f} tasks/s, experts {r['experts_us']:.0f} µs/task, "
                    f"etcd {r['etcd_us']:.0f} µs/task",
                    flush=True,
                )
    finally:
        server.close()
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
            check=False,
            capture_output=True,
        )
    med = {
        label: {k: statistics.median(r[k] for r in rs) for k in ("rate", "experts_us", "etcd_us")}
        for label, rs in results.items()
    }
    print(
        f"median: {args.rev} {med['old']['rate']:,.0f} tasks/s, this checkout "
        f"{med['new']['rate']:,.0f} tasks/s (x{med['new']['rate'] / med['old']['rate']:.2f}); "
        f"CPU per task {med['old']['experts_us'] + med['old']['etcd_us']:.0f} -> "
        f"{med['new']['experts_us'] + med['new']['etcd_us']:.0f} µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
