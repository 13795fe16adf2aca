"""What a task's own transaction costs: tasks/s of tasks that write to the store's database
inside ``ctx.transaction()`` — every task incrementing one counter (one hot row or key), or each
writing a row of its own — against no-op tasks committed the usual way.

``python -m benchmarks.transactions [--backends sqlite,postgresql,etcd] [--tasks 5000]
[--processes 1,2] [--concurrency 32] [--repeat 2] [--write]`` starts real ``contend expert``
processes for each (backend, kind, processes) and drains N tasks that all fall due at one
moment after they are submitted, timed from that moment to the last completion as the store
recorded it (as ``contend bench`` does). Each figure is the best of ``--repeat`` runs (this
machine is shared; the spread is printed, with the load average and ``contend bench``'s
machine-speed probe before each backend). ``--write`` puts the table into
``docs/exactly-once.md`` (between its benchmark markers) and the figures into
``docs/exactly-once.json``.

The stores: an SQLite file in a temporary folder; a fresh PostgreSQL database on
``CONTEND_TEST_PG`` (default 127.0.0.1:5432); a throwaway etcd started for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from benchmarks import transactions_app as bt
from contend.cli.bench import machine_speed
from contend.domain.task import TaskState
from contend.store.port import Store
from contend.store.registry import open_store
from contend.testing.counters import counter_for

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.transactions_app:app"
DOC = ROOT / "docs" / "exactly-once.md"
BEGIN, END = "<!-- transactions-bench -->", "<!-- /transactions-bench -->"


@asynccontextmanager
async def fresh_url(backend: str, tmp: str, n: int) -> AsyncIterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{os.path.join(tmp, f'tx{n}.db')}"
    elif backend == "postgresql":
        from contend.testing.postgres import fresh_database

        async with fresh_database() as url:
            yield url
    else:
        yield f"{_etcd_url()}/bench-{n}-{os.getpid()}"


_etcd: Any = None


def _etcd_url() -> str:
    global _etcd
    if _etcd is None:
        from contend.testing.etcd_server import EtcdServer, find_etcd

        _etcd = EtcdServer(find_etcd())
        _etcd.start()
    return str(_etcd.url)


def experts(url: str, n: int, concurrency: int) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contend",
                "--log-level",
                "WARNING",
                "expert",
                APP,
                "--store",
                url,
                "--name",
                f"tx-{i}",
                "--concurrency",
                str(concurrency),
            ],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )
        for i in range(n)
    ]


async def wait_live(store: Store, n: int) -> None:
    deadline = time.monotonic() + 60
    while len([e for e in await store.list_experts() if e.alive]) < n:
        if time.monotonic() > deadline:
            raise RuntimeError("experts did not start within 60s")
        await asyncio.sleep(0.05)


async def drain(url: str, kind: str, n: int, processes: int, concurrency: int) -> float:
    """Tasks/s of *n* tasks of *kind* drained by *processes* experts."""
    store = await open_store(url)
    counter = counter_for(store, "bench")
    await counter.prepare()
    procs = experts(url, processes, concurrency)
    try:
        await wait_live(store, processes)
        fn = {"plain": bt.plain, "counted": bt.counted, "own_row": bt.own_row}[kind]
        lead = 1.0 + n / 2_000
        specs = [bt.app.build_spec(fn, delay=lead) for _ in range(n)]
        for i in range(0, n, 1_000):
            await store.submit(specs[i : i + 1_000])
        t0 = min([(await store.get(specs[i].id)).run_at for i in (0, -1)])
        if await store.now() >= t0:
            raise RuntimeError(f"submitting {n:,} tasks took longer than {lead:.1f}s")
        deadline = time.monotonic() + 900
        while True:
            if (await store.backlog(["default"])).pending == 0:
                stats = await store.stats()
                done = sum(q.get(str(TaskState.SUCCEEDED), 0) for q in stats.counts.values())
                if done >= n:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all {n} tasks done after 900s")
            await asyncio.sleep(0.25)
        tasks = await store.list_tasks(state=TaskState.SUCCEEDED, limit=n)
        t1 = max(t.updated_at for t in tasks)
        if kind == "counted":
            value = await counter.value()
            if value != n:
                raise RuntimeError(f"the counter reads {value}, not {n}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        await store.close()
    return n / (t1 - t0)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tmp = tempfile.mkdtemp(prefix="contend-txbench-")
    n = 0
    for backend in args.backends.split(","):
        figures: dict[str, Any] = {
            "machine_speed": machine_speed(),
            "load_average": round(os.getloadavg()[0], 1),
        }
        print(
            f"{backend}: machine speed {figures['machine_speed']:,} JSON round trips/s, "
            f"load average {figures['load_average']}",
            flush=True,
        )
        for processes in [int(p) for p in args.processes.split(",")]:
            for kind in ("plain", "counted", "own_row"):
                rates = []
                for _ in range(args.repeat):
                    n += 1
                    async with fresh_url(backend, tmp, n) as url:
                        rates.append(
                            await drain(url, kind, args.tasks, processes, args.concurrency)
                        )
                key = f"{kind}_{processes}p_per_s"
                figures[key] = round(max(rates))
                figures[key.replace("_per_s", "_runs")] = [round(r) for r in rates]
                print(
                    f"{backend}: {args.tasks:,} {kind} tasks, {processes} process(es): "
                    f"best {max(rates):,.0f}/s of {', '.join(f'{r:,.0f}' for r in rates)}",
                    flush=True,
                )
        out[backend] = figures
    return out


def table(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "| backend | expert processes | plain tasks/s | in a transaction, one counter/s | "
        "in a transaction, a row each/s | machine speed, load average |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for backend, f in results.items():
        for p in [int(x) for x in args.processes.split(",")]:
            plain, counted, own = (f[f"{k}_{p}p_per_s"] for k in ("plain", "counted", "own_row"))
            lines.append(
                f"| {backend} | {p} | {plain:,} | {counted:,} ({counted / plain:.0%}) "
                f"| {own:,} ({own / plain:.0%}) "
                f"| {f['machine_speed']:,}, {f['load_average']} |"
            )
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines.append("")
    lines.append(
        f"{args.tasks:,} tasks per run, expert concurrency {args.concurrency}, best of "
        f"{args.repeat} runs; measured {when} on {platform.node()} ({os.cpu_count()} cores)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    try:
        results = asyncio.run(run(args))
    finally:
        if _etcd is not None:
            _etcd.close()
    text = table(results, args)
    print(text)
    if args.write:
        (ROOT / "docs" / "exactly-once.json").write_text(json.dumps(results, indent=2) + "\n")
        doc = DOC.read_text()
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
