"""One measurement of one contend shape (runs in the project's virtualenv, this checkout).

``python -m benchmarks.peers.contend_child BACKEND --body sync|async --concurrency C
[--processes 2] [--tasks N] [--samples S] [--etcd URL --etcd-pid PID]`` prints progress on
stderr and one JSON line on stdout, with the same keys as :mod:`benchmarks.peers.peer_child`.

It is ``contend bench``'s own code (``Bench.latency`` and ``Bench.drain``), run at the given
shape: idle latency with the shape's expert processes, then a drain of N no-op tasks that all
fall due at one moment after their submission is in. CPU per task: the expert processes and,
on PostgreSQL and etcd, the server processes serving the store (every backend of the bench
database, the bench's own light polling included; the etcd server), read from ``/proc`` from
the due moment to the last completion.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from typing import Any

from benchmarks.peers.common import CpuMeter, fresh_pg_database, pg_backend_pids, print_result, say


async def measure(url: str | None, args: argparse.Namespace) -> dict[str, Any]:
    from contend.cli.bench import Bench

    bench = Bench(
        argparse.Namespace(
            quick=args.samples <= 100, tasks=args.tasks, concurrency=args.concurrency,
            store=url, body=args.body,
        )
    )  # fmt: skip
    bench.n = args.tasks
    meters: list[tuple[CpuMeter, CpuMeter]] = []
    cpu: list[tuple[float, float]] = []
    start_experts, wait_done = bench.experts, bench.wait_done

    def server() -> list[int]:
        if url and url.startswith("postgresql"):
            return pg_backend_pids(url)
        return [args.etcd_pid] if args.etcd_pid else []

    async def experts(*a: Any, **kw: Any) -> Any:
        procs = await start_experts(*a, **kw)
        meters[:] = [(CpuMeter(lambda: [p.pid for p in procs]), CpuMeter(server))]
        return procs

    async def timed_wait(*a: Any, **kw: Any) -> None:
        # Bench.drain calls this at the moment the tasks fall due
        experts_meter, server_meter = meters[0]
        experts_meter.start()
        server_meter.start()
        await wait_done(*a, **kw)
        cpu.append((experts_meter.stop(), server_meter.stop()))

    try:
        await bench.latency(processes=args.processes, concurrency=args.concurrency)
        bench.experts, bench.wait_done = experts, timed_wait  # type: ignore[method-assign]
        await bench.drain(args.processes)
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    r, n = bench.results, args.tasks
    ((experts_s, server_s),) = cpu
    return {
        "latency_p50_ms": r["latency_p50_ms"],
        "latency_p99_ms": r["latency_p99_ms"],
        "submit_call_p50_ms": r["submit_call_p50_ms"],
        "drain_per_s": r[f"drain_{args.processes}p_per_s"],
        "workers_us": round(experts_s * 1e6 / n, 1),
        "server_us": round(server_s * 1e6 / n, 1),
        "cpu_us": round((experts_s + server_s) * 1e6 / n, 1),
    }


async def child(args: argparse.Namespace) -> dict[str, Any]:
    if args.backend == "postgresql":
        with fresh_pg_database() as dsn:
            return await measure(dsn, args)
    if args.backend == "etcd":
        return await measure(args.etcd, args)
    return await measure(None, args)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.contend_child")
    parser.add_argument("backend", choices=["sqlite", "postgresql", "etcd"])
    parser.add_argument("--body", choices=["sync", "async"], default="async")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument(
        "--samples", type=int, choices=[100, 300], default=300, help="idle latency samples"
    )
    parser.add_argument("--etcd", help="the etcd store URL (with its prefix)")
    parser.add_argument("--etcd-pid", type=int, default=0)
    args = parser.parse_args()
    out = asyncio.run(child(args))
    say(
        f"    contend {args.backend} {args.body} {args.processes}×{args.concurrency}: drain "
        f"{out['drain_per_s']:,}/s, CPU {out['cpu_us']:.0f} µs/task (experts "
        f"{out['workers_us']:.0f}, server {out['server_us']:.0f}); idle latency p50 "
        f"{out['latency_p50_ms']:.2f} ms p99 {out['latency_p99_ms']:.2f} ms; submit call p50 "
        f"{out['submit_call_p50_ms']:.2f} ms"
    )
    print_result(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
