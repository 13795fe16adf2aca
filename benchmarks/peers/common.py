"""What the peer and sustained-load benchmarks share, on either side of the two virtualenvs.

The project's own virtualenv runs contend; a throwaway one (``scripts/bench-venv.sh``) runs
the peers. Both import this module, so it needs the standard library and psycopg only.

* CPU time of processes (and of their children) from ``/proc``, user + system, all threads;
* the server-side processes of a store: PostgreSQL backends of one database, the Redis
  server, etcd;
* a fresh PostgreSQL database per measurement (``bench_<random>``);
* a UDP receiver for the time stamps that tasks send when they start, so that every system's
  submit-to-start latency is taken the same way, on this host's clock;
* the child-process protocol: a measurement prints progress on stderr and one JSON line last
  on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
TICK = os.sysconf("SC_CLK_TCK")
PG_SERVER = os.environ.get("CONTEND_BENCH_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("CONTEND_BENCH_REDIS", "redis://127.0.0.1:6379/0")
STAMP_PORT_ENV = "BENCH_STAMP_PORT"


def say(text: str) -> None:
    """Progress, on stderr (stdout carries a child's JSON result)."""
    print(text, file=sys.stderr, flush=True)


# -- CPU from /proc ----------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU of process *pid* (all its threads) so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def process_tree(pid: int) -> list[int]:
    """*pid* and all its descendants (Huey's worker processes, a CLI's children)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


class CpuMeter:
    """CPU spent by a changing set of processes between :meth:`start` and :meth:`stop`.

    ``pids()`` is called at both ends; a process seen only at the end counts whole (it began
    inside the interval), one seen only at the start counts what it had used by then (it ended
    inside the interval, and its last moments are lost: a small undercount)."""

    def __init__(self, pids: Any) -> None:
        self._pids = pids
        self._before: dict[int, float] = {}

    def start(self) -> None:
        self._before = {p: cpu_seconds(p) for p in self._pids()}

    def stop(self) -> float:
        after = {p: cpu_seconds(p) for p in self._pids()}
        return sum(v - self._before.get(p, 0.0) for p, v in after.items())


def pg_backend_pids(dsn: str, exclude: Sequence[int] = ()) -> list[int]:
    """The server processes serving connections to *dsn*'s database, less *exclude* (the
    benchmark's own connections)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        mine = conn.execute("SELECT pg_backend_pid()").fetchone()
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    skip = {*exclude, mine[0] if mine else -1}
    return [int(r[0]) for r in rows if int(r[0]) not in skip and os.path.exists(f"/proc/{r[0]}")]


def redis_server_pid(url: str = REDIS_URL) -> int | None:
    """The Redis server's pid (from ``INFO server``), if it runs on this host."""
    host, port = url.split("//", 1)[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"INFO server\r\n")
        data = b""
        while b"process_id:" not in data or not data.endswith(b"\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("process_id:"):
            pid = int(line.split(":", 1)[1])
            return pid if os.path.exists(f"/proc/{pid}") else None
    return None


# -- PostgreSQL ----------------------------------------------------------------------------------
@contextlib.contextmanager
def fresh_pg_database(server: str = PG_SERVER) -> Iterator[str]:
    """Create ``bench_<random>``, yield its URL, drop it (and any connection to it) after."""
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{server}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_tables_size(dsn: str) -> int:
    """Bytes of every table of the database's ordinary schemas, with indexes and TOAST."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r'"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchone()
    return int(row[0]) if row else 0


def pg_checkpoints(dsn: str) -> int:
    """How many checkpoints the server has begun (timed and requested), since its stats reset."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        ).fetchone()
    return int(row[0]) if row else 0


# -- start stamps over UDP -----------------------------------------------------------------------
def send_stamp(key: str, port: int | None = None) -> None:
    """Called by a task when it starts: ``key time.time()`` to the benchmark's receiver."""
    port = port or int(os.environ[STAMP_PORT_ENV])
    msg = f"{key} {time.time():.6f}".encode()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(msg, ("127.0.0.1", port))


class _Stamps(asyncio.DatagramProtocol):
    def __init__(self, sink: StampReceiver) -> None:
        self.sink = sink

    def datagram_received(self, data: bytes, addr: Any) -> None:
        key, _, when = data.decode().partition(" ")
        self.sink.got(key, float(when))


class StampReceiver:
    """Collects ``key -> start time`` from tasks; :meth:`wait` for a key with a deadline."""

    def __init__(self) -> None:
        self.stamps: dict[str, float] = {}
        self.port = 0
        self._waiters: dict[str, asyncio.Future[float]] = {}
        self._transport: asyncio.DatagramTransport | None = None

    async def __aenter__(self) -> StampReceiver:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _Stamps(self), sock=sock)
        os.environ[STAMP_PORT_ENV] = str(self.port)  # the workers started after this inherit it
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            self._transport.close()

    def got(self, key: str, when: float) -> None:
        self.stamps[key] = when
        waiter = self._waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(when)

    async def wait(self, key: str, timeout: float = 30.0) -> float:
        if key in self.stamps:
            return self.stamps[key]
        fut = asyncio.get_running_loop().create_future()
        self._waiters[key] = fut
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise RuntimeError(f"task {key} did not start within {timeout:.0f}s") from None


# -- figures ---------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100), nearest rank, as ``contend bench`` takes its p99."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def latency_figures(samples_ms: Sequence[float], calls_ms: Sequence[float]) -> dict[str, float]:
    return {
        "latency_p50_ms": round(statistics.median(samples_ms), 2),
        "latency_p99_ms": round(percentile(samples_ms, 99), 2),
        "submit_call_p50_ms": round(statistics.median(calls_ms), 2),
    }


def print_result(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


async def poll(predicate: Any, timeout: float, interval: float, what: str) -> None:
    """Call the coroutine function *predicate* until it returns true, or fail after *timeout*."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f}s")
        await asyncio.sleep(interval)
