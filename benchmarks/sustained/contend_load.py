"""The sustained-load run for contend (project virtualenv, this checkout).

``python -m benchmarks.sustained.contend_load BACKEND [--body async|sync] [--concurrency 8]
[--processes 2] [--rate 1000] [--duration 600] [--hold] [--tail 60] [--etcd URL]`` prints
progress on stderr and its figures as one JSON line on stdout (see
:mod:`benchmarks.sustained.driver`). The experts are ``contend bench``'s (``Bench.experts``),
running :mod:`benchmarks.sustained.load_app`; the producer submits through the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import urllib.request
from typing import Any

from benchmarks.peers.common import (
    fresh_pg_database,
    pg_checkpoints,
    pg_tables_size,
    print_result,
)
from benchmarks.sustained.driver import Plan, System, plan_arguments, plan_of, run


def _etcd_db_size(url: str) -> int:
    host = url.split("//", 1)[1].split("/", 1)[0]
    req = urllib.request.Request(f"http://{host}/v3/maintenance/status", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.loads(resp.read())["dbSize"])


def _sqlite_size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


async def load(url: str, args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    from benchmarks.sustained import load_app
    from contend.cli.bench import Bench
    from contend.store.registry import open_store

    bench = Bench(
        argparse.Namespace(quick=False, tasks=0, concurrency=args.concurrency, store=url,
                           app="benchmarks.sustained.load_app:app")
    )  # fmt: skip
    task = load_app.stamp_sync if args.body == "sync" else load_app.stamp
    store = await open_store(url)
    procs: list[Any] = []

    async def start() -> None:
        procs[:] = await bench.experts(url, args.processes)
        await bench.wait_live(store, args.processes, procs)

    async def submit(keys: list[str]) -> None:
        await store.submit([load_app.app.build_spec(task, [k]) for k in keys])

    async def size() -> int:
        if url.startswith("postgresql"):
            return await asyncio.to_thread(pg_tables_size, url)
        if url.startswith("etcd"):
            return await asyncio.to_thread(_etcd_db_size, url)
        return _sqlite_size(url.removeprefix("sqlite:///"))

    async def stop() -> None:
        await Bench.stop(procs)

    checkpoints = None
    if url.startswith("postgresql"):

        async def checkpoints() -> int:
            return await asyncio.to_thread(pg_checkpoints, url)

    name = f"contend {args.backend} {args.body} {args.processes}×{args.concurrency}"
    hold_url = None if url.startswith("etcd") else url
    try:
        return await run(System(name, start, submit, size, stop, hold_url, checkpoints), plan)
    finally:
        await store.close()
        shutil.rmtree(bench.tmp, ignore_errors=True)


async def child(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    if args.backend == "postgresql":
        with fresh_pg_database() as dsn:
            return await load(dsn, args, plan)
    if args.backend == "etcd":
        return await load(args.etcd, args, plan)
    tmp = tempfile.mkdtemp(prefix="bench-sustained-")
    try:
        return await load(f"sqlite:///{os.path.join(tmp, 'load.db')}", args, plan)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sustained.contend_load")
    parser.add_argument("backend", choices=["sqlite", "postgresql", "etcd"])
    parser.add_argument("--body", choices=["sync", "async"], default="async")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--etcd", help="the etcd store URL (with its prefix)")
    plan_arguments(parser)
    args = parser.parse_args()
    print_result(asyncio.run(child(args, plan_of(args))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
