"""The CPU an expert costs while it has nothing to do: its store idle, down, or hanging.

``python -m benchmarks.idle_cpu [--backends sqlite,postgresql,etcd] [--seconds 30] [--lease 15]``
starts one real ``contend expert`` process per backend (no tasks) and reads its CPU time (user +
system, all threads, from ``/proc/PID/stat``) over ``--seconds`` in each state:

* **idle** — the store is up, nothing to claim;
* **down** — the store refuses connections (a TCP fault proxy between the expert and
  PostgreSQL or etcd is cut; the machine's own servers are never touched). The expert loses its
  lease and tries to open a new session, with back-off;
* **hung** — the store accepts and never answers (the proxy frozen: packets vanish, no reset);
  for SQLite, another connection holds the write lock.

Each faulty state is measured from one lease after the fault began, when the expert has lost
its session and settled into retrying. The figures are printed and written to
``docs/idle-cpu.json`` and ``docs/idle-cpu.md`` (``--no-write`` to skip), as percent of one core.

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
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks import commit

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.idle_app:app"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process *pid* (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class Fault:
    """A way to break one backend's store, and to mend it."""

    name: str
    apply: Callable[[], None]
    mend: Callable[[], None]


@contextmanager
def an_expert(url: str, lease: float, logdir: Path) -> Iterator[int]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "contend", "expert", APP, "--store", url]
    log = open(logdir / f"expert-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*command, "--name", "idle", "--lease", str(lease)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    try:
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


async def registered(url: str, within: float = 60.0) -> None:
    """Wait until the expert named idle is live in the store."""
    from contend.store.registry import open_store

    store = await open_store(url)
    try:
        deadline = time.monotonic() + within
        while not any(e.alive and e.info.id == "idle" for e in await store.list_experts()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the expert did not register within {within:.0f}s")
            await asyncio.sleep(0.2)
    finally:
        await store.close()


async def usage(pid: int, seconds: float) -> float:
    """Percent of one core that *pid* used over the next *seconds*."""
    before, began = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - began)


async def measure(
    expert_url: str, store_url: str, faults: list[Fault], args: argparse.Namespace, logdir: Path
) -> dict[str, float]:
    out: dict[str, float] = {}
    with an_expert(expert_url, args.lease, logdir) as pid:
        try:
            await registered(store_url)
        except RuntimeError as exc:
            logs = sorted(logdir.glob("expert-*.log"))
            tail = logs[-1].read_text(errors="replace")[-2000:] if logs else ""
            raise RuntimeError(f"{exc}; the expert's log ends:\n{tail}") from None
        await asyncio.sleep(2.0)  # past start-up
        out["idle"] = await usage(pid, args.seconds)
        for fault in faults:
            fault.apply()
            try:
                await asyncio.sleep(args.lease)  # the session is lost by now; retrying
                out[fault.name] = await usage(pid, args.seconds)
            finally:
                fault.mend()
            await registered(store_url, within=60 + args.lease)  # back to normal before the next
    return out


def proxied(url: str, host: str, port: int) -> tuple[str, list[Fault], Callable[[], None]]:
    from contend.testing.proxy import FaultProxy

    proxy = FaultProxy(host, port).start()
    faults = [
        Fault("down", proxy.cut, proxy.heal),
        Fault("hung", proxy.freeze, proxy.heal),
    ]
    return proxy.url(url), faults, proxy.close


async def run_sqlite(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    path = tmp / "idle.db"
    url = f"sqlite:///{path}"
    lock: list[sqlite3.Connection] = []

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        lock.append(conn)

    def free() -> None:
        conn = lock.pop()
        conn.execute("ROLLBACK")
        conn.close()

    return await measure(url, url, [Fault("hung", hold, free)], args, tmp)


async def run_postgresql(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    from contend.testing.postgres import fresh_database

    async with fresh_database() as url:
        where = urlsplit(url)
        expert_url, faults, close = proxied(url, where.hostname or "127.0.0.1", where.port or 5432)
        try:
            return await measure(expert_url, url, faults, args, tmp)
        finally:
            close()


async def run_etcd(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    from contend.testing.etcd_server import EtcdServer

    server = EtcdServer()
    server.start()
    try:
        url = f"{server.url}/idle"
        expert_url, faults, close = proxied(url, "127.0.0.1", server.client_port)
        try:
            return await measure(expert_url, url, faults, args, tmp)
        finally:
            close()
    finally:
        server.close()


RUNS = {"sqlite": run_sqlite, "postgresql": run_postgresql, "etcd": run_etcd}
STATES = ("idle", "down", "hung")


def markdown(figures: dict[str, dict[str, float]], meta: dict[str, object]) -> str:
    rows = [
        "| backend | " + " | ".join(STATES) + " |",
        "|---|" + "---:|" * len(STATES),
    ]
    for backend, got in figures.items():
        cells = [f"{got[s]:.2f} %" if s in got else "—" for s in STATES]
        rows.append(f"| {backend} | " + " | ".join(cells) + " |")
    return "\n".join(
        [
            "# Idle CPU of an expert",
            "",
            "Percent of one core used by one `contend expert` process with no tasks, per state"
            " of its store (written by `python -m benchmarks.idle_cpu`; see its docstring for"
            " how each state is made). *down*: connections refused; *hung*: connections that"
            " never answer (SQLite: the write lock held by another connection).",
            "",
            *rows,
            "",
            f"Measured {meta['date']} at commit {meta['commit']} on {meta['host']}"
            f" ({meta['cpus']} cores, shared), lease {meta['lease']} s,"
            f" {meta['seconds']} s per state.",
            "",
        ]
    )


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql,etcd")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--lease", type=float, default=15.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="contend-idle-") as tmp:
        for backend in args.backends.split(","):
            got = await RUNS[backend](args, Path(tmp))
            figures[backend] = got
            print(backend, "  ".join(f"{k} {v:.2f}%" for k, v in got.items()), flush=True)
    meta: dict[str, object] = {
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "lease": args.lease,
        "seconds": args.seconds,
    }
    if not args.no_write:
        docs = ROOT / "docs"
        (docs / "idle-cpu.json").write_text(
            json.dumps({"meta": meta, "percent_of_a_core": figures}, indent=2) + "\n"
        )
        (docs / "idle-cpu.md").write_text(markdown(figures, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
