"""How long a task waits after its expert is killed: supervised, and not.

``python -m benchmarks.recovery [--backends sqlite,postgresql,etcd] [--kills 10] [--lease 15]``
starts ``contend supervise -n 2`` (real processes, concurrency 1, the lease given) per backend
and, ``--kills`` times, submits a long task, waits for it to run, kills its expert with SIGKILL
and measures the time until the task runs again under a new claim (fence + 1) on the other
expert or on the replacement. The supervisor sees the child die and ends its session in the
store (``Store.end_session``), so the figure does not depend on the lease. For comparison, one
kill of an expert *not* supervised (two plain ``contend expert`` processes): its task waits for
the lease to run out.

The figures are printed and written to ``docs/recovery.json`` and ``docs/recovery.md``
(``--no-write`` to skip). The stores: an SQLite file in a temporary folder; a fresh PostgreSQL
database on ``CONTEND_TEST_PG`` (default 127.0.0.1:5432); a throwaway etcd.
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
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from benchmarks import commit
from contend.domain.task import TaskSpec, TaskState
from contend.store.port import Store
from contend.store.registry import open_store

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.acceptance.sample_app:app"


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), out.get("PYTHONPATH", "")])
    out.pop("CONTEND_STORE", None)
    return out


@contextmanager
def processes(commands: list[list[str]], logdir: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = []
    for n, cmd in enumerate(commands):
        with open(logdir / f"proc-{n}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=env(), cwd=ROOT))
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


async def until(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


async def one_kill(store: Store, lease: float) -> float:
    """Submit a long task, kill its expert, return the seconds until it runs again; then
    cancel the task and wait for every live expert's next renewal, at which the one running
    it learns of the cancellation and stops it (docs/how-to.md, "Cancel a task"). Until then
    its one slot is taken, and the next kill would measure the replacement's start-up
    (about 1 s) instead of the survivor's pickup."""
    (spec,) = [TaskSpec.build("slow", [600.0], max_attempts=1000)]
    await store.submit([spec])

    async def running() -> tuple[str, int] | None:
        t = await store.get(spec.id)
        return (t.owner, t.fence) if t.state == TaskState.RUNNING and t.owner else None

    owner, fence = await until(running, 120, "the task to run")
    (rec,) = [e for e in await store.list_experts() if e.alive and e.info.id == owner]
    os.kill(rec.info.pid, signal.SIGKILL)
    killed = time.monotonic()

    async def again() -> bool:
        t = await store.get(spec.id)
        return t.state == TaskState.RUNNING and t.fence > fence

    await until(again, lease * 3, "the task to run again")
    took = time.monotonic() - killed
    await store.cancel(spec.id)
    cancelled = await store.now()
    await until(lambda: renewed_since(store, cancelled), lease * 2, "renewals after the cancel")
    return took


async def live(store: Store, n: int) -> bool:
    return sum(e.alive for e in await store.list_experts()) >= n


async def renewed_since(store: Store, at: float) -> bool:
    return all(e.heartbeat_at > at for e in await store.list_experts() if e.alive)


async def measure(url: str, args: argparse.Namespace, logdir: Path) -> dict[str, Any]:
    base = [sys.executable, "-m", "contend"]
    opts = ["--store", url, "--lease", str(args.lease), "--concurrency", "1", "--grace", "0"]
    store = await open_store(url)
    try:
        supervised = []
        with processes([[*base, "supervise", "-n", "2", APP, "--name", "sup", *opts]], logdir):
            for _ in range(args.kills):
                await until(lambda: live(store, 2), 120, "two live experts")
                supervised.append(await one_kill(store, args.lease))
        await until(lambda: _none_live(store), 60, "the supervised experts to stop")
        plain = [[*base, "expert", APP, "--name", f"plain-{n}", *opts] for n in range(2)]
        with processes(plain, logdir):
            await until(lambda: live(store, 2), 120, "two plain experts")
            unsupervised = await one_kill(store, args.lease)
    finally:
        await store.close()
    return {
        "supervised_ms": [round(s * 1000, 1) for s in supervised],
        "median_ms": round(statistics.median(supervised) * 1000, 1),
        "max_ms": round(max(supervised) * 1000, 1),
        "unsupervised_s": round(unsupervised, 2),
    }


async def _none_live(store: Store) -> bool:
    return not any(e.alive for e in await store.list_experts())


@asynccontextmanager
async def backend(name: str, tmp: Path) -> AsyncIterator[str]:
    if name == "sqlite":
        yield f"sqlite:///{tmp / 'recovery.db'}"
    elif name == "postgresql":
        from contend.testing.postgres import fresh_database

        async with fresh_database() as url:
            yield url
    else:
        from contend.testing.etcd_server import EtcdServer

        server = EtcdServer()
        server.start()
        try:
            yield f"{server.url}/recovery"
        finally:
            server.close()


def markdown(figures: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    rows = [
        "| backend | supervised: median | supervised: worst | not supervised |",
        "|---|---:|---:|---:|",
    ]
    for name, got in figures.items():
        rows.append(
            f"| {name} | {got['median_ms']:.0f} ms | {got['max_ms']:.0f} ms"
            f" | {got['unsupervised_s']:.1f} s |"
        )
    return "\n".join(
        [
            "# Recovery from kill -9",
            "",
            "Time from `kill -9` of the expert running a task to that task running again under"
            " a new claim, with `contend supervise -n 2` (which ends the dead expert's session in"
            " the store the moment it sees the process die) and with two plain `contend expert`"
            " processes (the task waits for the lease). Written by"
            " `python -m benchmarks.recovery` (`make recovery-bench`); see its docstring.",
            "",
            *rows,
            "",
            f"Measured {meta['date']} at commit {meta['commit']} on {meta['host']}"
            f" ({meta['cpus']} cores, shared), lease {meta['lease']} s,"
            f" {meta['kills']} supervised kills per backend.",
            "",
        ]
    )


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql,etcd")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease", type=float, default=15.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="contend-recovery-") as tmp:
        for name in args.backends.split(","):
            logdir = Path(tmp) / name
            logdir.mkdir()
            async with backend(name, Path(tmp)) as url:
                figures[name] = got = await measure(url, args, logdir)
            print(
                f"{name}: supervised median {got['median_ms']} ms, worst {got['max_ms']} ms; "
                f"not supervised {got['unsupervised_s']} s",
                flush=True,
            )
    meta = {
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "lease": args.lease,
        "kills": args.kills,
    }
    if not args.no_write:
        docs = ROOT / "docs"
        (docs / "recovery.json").write_text(json.dumps({"meta": meta, **figures}, indent=2) + "\n")
        (docs / "recovery.md").write_text(markdown(figures, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
