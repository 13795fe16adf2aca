"""One measurement of one peer (runs in the bench virtualenv): idle latency, then a drain.

``python -m benchmarks.peers.peer_child PEER --tasks N --samples S`` prints its progress on
stderr and one JSON line on stdout: drain rate, CPU per task (the worker processes and, where
the store is a server on this host, the server processes serving them), idle submit-to-start
p50/p99 and one submit call's p50.

* **Latency**: the workers running and idle; one ``stamp`` task at a time after a random gap of
  0-10 ms; from just before the submit call to the moment the task started (sent over UDP);
  the first 20 are a warm-up.
* **Drain**: the workers started but held at their start line; N ``noop`` tasks enqueued in
  bulk; then the workers let go at once; timed from that moment until the queue holds none
  (polled every 5 ms on a connection of its own, which the CPU figure leaves out), or until
  ``--drain-limit`` seconds have passed (then the rate of the part that was done).

A fresh store each time: a PostgreSQL database ``bench_…``, an SQLite file in a temporary
folder, a Huey name of its own on Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks.peers.common import (
    ROOT,
    CpuMeter,
    StampReceiver,
    fresh_pg_database,
    latency_figures,
    print_result,
    process_tree,
    say,
)
from benchmarks.peers.peer_systems import BACKEND, make

WARM_UP = 20


class Workers:
    """The peer's worker processes, started and held until :meth:`go`."""

    def __init__(self, peer: str, target: str, count: int) -> None:
        self.peer, self.target, self.count = peer, target, count
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for _ in range(self.count):
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "benchmarks.peers.peer_worker",
                    self.peer,
                    self.target,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    env=env,
                    cwd=ROOT,
                )
            )
        for p in self.procs:
            assert p.stdout is not None
            line = await asyncio.wait_for(p.stdout.readline(), 60)
            if line.strip() != b"ready":
                raise RuntimeError(f"a {self.peer} worker did not start (exit {p.returncode})")

    def pids(self) -> list[int]:
        return [q for p in self.procs if p.returncode is None for q in process_tree(p.pid)]

    def go(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")

    async def stop(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                for q in process_tree(p.pid):
                    os.kill(q, signal.SIGKILL)
                await p.wait()


@contextmanager
def a_store(peer: str) -> Iterator[str]:
    backend = BACKEND[peer]
    if backend == "postgresql":
        with fresh_pg_database() as dsn:
            yield dsn
    elif backend == "sqlite":
        tmp = tempfile.mkdtemp(prefix="bench-huey-")
        try:
            yield os.path.join(tmp, "huey.db")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        yield f"redis:bench_{uuid.uuid4().hex[:12]}"


async def latency(peer: str, target: str, system: Any, samples: int) -> dict[str, float]:
    workers = Workers(peer, target, system.processes)
    lat: list[float] = []
    calls: list[float] = []
    async with StampReceiver() as stamps:
        await workers.start()
        workers.go()
        try:
            for n in range(WARM_UP + samples):
                await asyncio.sleep(random.uniform(0.0, 0.01))
                key = f"l{n}"
                sent, began = time.time(), time.perf_counter()
                await system.submit_one(key)
                call = time.perf_counter() - began
                started = await stamps.wait(key)
                if n >= WARM_UP:
                    lat.append((started - sent) * 1000)
                    calls.append(call * 1000)
        finally:
            await workers.stop()
    return latency_figures(lat, calls)


async def drain(peer: str, target: str, system: Any, n: int, limit: float) -> dict[str, Any]:
    workers = Workers(peer, target, system.processes)
    await workers.start()
    try:
        began = time.perf_counter()
        await system.submit_noops(n)
        submit_s = time.perf_counter() - began
        server = await system.server_pids()
        meter_workers, meter_server = CpuMeter(workers.pids), CpuMeter(lambda: server)
        meter_workers.start()
        meter_server.start()
        t0 = time.perf_counter()
        workers.go()
        left = n
        while left and time.perf_counter() - t0 < limit:
            await asyncio.sleep(0.005)
            left = await system.remaining()
        elapsed = time.perf_counter() - t0
        cpu_workers, cpu_server = meter_workers.stop(), meter_server.stop()
    finally:
        await workers.stop()
    done = n - left
    if left:
        say(
            f"    {peer}: {left:,} of {n:,} tasks still queued after {limit:.0f}s; rate of the rest"
        )
    return {
        "drain_per_s": round(done / elapsed),
        "drained": done,
        "bulk_submit_per_s": round(n / submit_s),
        "workers_us": round(cpu_workers * 1e6 / done, 1),
        "server_us": round(cpu_server * 1e6 / done, 1),
        "cpu_us": round((cpu_workers + cpu_server) * 1e6 / done, 1),
    }


async def measure(peer: str, n: int, samples: int, limit: float) -> dict[str, Any]:
    with a_store(peer) as target:
        system = make(peer, target)
        await system.open()
        try:
            await system.setup()
            out: dict[str, Any] = await latency(peer, target, system, samples)
            out |= await drain(peer, target, system, n, limit)
        finally:
            await system.close()
    say(
        f"    {peer}: drain {out['drain_per_s']:,}/s, CPU {out['cpu_us']:.0f} µs/task "
        f"(workers {out['workers_us']:.0f}, server {out['server_us']:.0f}); idle latency "
        f"p50 {out['latency_p50_ms']:.2f} ms p99 {out['latency_p99_ms']:.2f} ms; "
        f"submit call p50 {out['submit_call_p50_ms']:.2f} ms"
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.peer_child")
    parser.add_argument("peer")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument(
        "--drain-limit", type=float, default=60.0, help="stop a drain after this many seconds"
    )
    args = parser.parse_args()
    print_result(asyncio.run(measure(args.peer, args.tasks, args.samples, args.drain_limit)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
