"""``contend bench``: throughput, latency and memory of real expert processes on one store.

Everything runs in one go on this machine, so the figures can be compared side by side:

* submit throughput, one task per call and in batches of 1,000;
* drain throughput of N no-op tasks with 1 and 2 expert processes (from the moment the batch
  is committed to the last completion, as the store recorded it);
* submit-to-start latency on an idle system (p50/p99 of 300 tasks sent one at a time), and how
  long one ``submit`` call of one task took (p50);
* an expert's peak resident memory after a first submission of 5,000 tasks (1,000 when N is
  under 20,000) and after N (it must not grow with the number of tasks processed).

The task bodies are coroutine functions by default; ``--body sync`` measures plain functions,
which an expert runs off its event loop.

Results go to ``docs/benchmarks.json`` (keyed by backend) and ``docs/benchmarks.md``. Other
benchmarks put their own sections into that page between ``<!-- begin NAME -->`` and
``<!-- end NAME -->`` lines; rewriting the page keeps those sections.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from contend.demo import bench_tasks as bt
from contend.domain.task import TaskState
from contend.store.port import Store
from contend.store.registry import open_store

APP = "contend.demo.bench_tasks:app"
#: Tasks per submission of the memory measure, and the first part's size (see ``memory``).
MEMORY_BATCH = 5_000


def _say(text: str) -> None:
    print(text, flush=True)


class _Stamps(asyncio.DatagramProtocol):
    """Receives the latency probe's ``key time`` datagrams (``bench_tasks.stamp``) on a port
    of this host."""

    #: seconds a probe task may take to start before the bench gives up
    WITHIN = 30.0

    def __init__(self) -> None:
        self.port = 0
        self._got: dict[int, float] = {}
        self._arrived = asyncio.Event()
        self._transport: asyncio.DatagramTransport | None = None

    async def __aenter__(self) -> _Stamps:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=("127.0.0.1", 0)
        )
        self.port = self._transport.get_extra_info("sockname")[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            self._transport.close()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        key, _, when = data.decode().partition(" ")
        self._got[int(key)] = float(when)
        self._arrived.set()

    async def wait(self, key: int, procs: list[asyncio.subprocess.Process]) -> float:
        """When task *key* started; an error if it did not within WITHIN seconds or an expert
        exited meanwhile."""
        deadline = time.monotonic() + self.WITHIN
        while key not in self._got:
            dead = [p.returncode for p in procs if p.returncode is not None]
            if dead:
                raise RuntimeError(f"a bench expert exited with {dead[0]} (see its output above)")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"the latency probe's task {key} did not start in {self.WITHIN:g}s"
                )
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), min(left, 1.0))
            except TimeoutError:
                pass
        return self._got.pop(key)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="contend-bench-")
        # the harnesses that drive a Bench (benchmarks/) never removed it: its SQLite files,
        # tens of MB a drain, piled up in /tmp
        atexit.register(shutil.rmtree, self.tmp, ignore_errors=True)
        self.n = 2_000 if args.quick else args.tasks
        self.concurrency: int = args.concurrency
        self.results: dict[str, Any] = {}
        self._count = 0
        # the task bodies: coroutine functions, or plain ones (--body sync)
        self.body: str = getattr(args, "body", "async")
        self.app: str = getattr(args, "app", APP)  # MODULE:APP the experts run
        self.noop = bt.noop_sync if self.body == "sync" else bt.noop
        self.stamp = bt.stamp_sync if self.body == "sync" else bt.stamp

    def url(self) -> str:
        """A fresh store for each measurement."""
        self._count += 1
        if self.args.store:
            return str(self.args.store)
        return f"sqlite:///{os.path.join(self.tmp, f'bench{self._count}.db')}"

    async def fresh(self) -> tuple[str, Store]:
        url = self.url()
        store = await open_store(url)
        if self.args.store:  # a shared server store: start from an empty table
            await _purge(store)
        return url, store

    async def experts(
        self, url: str, n: int, concurrency: int | None = None
    ) -> list[asyncio.subprocess.Process]:
        procs = []
        for i in range(n):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "contend",
                    "--log-level",
                    "WARNING",
                    "expert",
                    self.app,
                    "--store",
                    url,
                    "--name",
                    f"bench-{i}",
                    "--concurrency",
                    str(concurrency or self.concurrency),
                    stdin=asyncio.subprocess.DEVNULL,
                )
            )
        return procs

    @staticmethod
    async def stop(procs: list[asyncio.subprocess.Process]) -> None:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        await asyncio.gather(*(p.wait() for p in procs))

    async def wait_live(
        self, store: Store, n: int, procs: list[asyncio.subprocess.Process]
    ) -> None:
        deadline = time.monotonic() + 30
        while len([e for e in await store.list_experts() if e.alive]) < n:
            dead = [p.returncode for p in procs if p.returncode is not None]
            if dead:
                raise RuntimeError(f"a bench expert exited with {dead[0]} (see its output above)")
            if time.monotonic() > deadline:
                raise RuntimeError("experts did not start within 30s")
            await asyncio.sleep(0.05)

    @staticmethod
    async def wait_done(store: Store, n: int, timeout: float = 600) -> None:
        """Until *n* tasks have succeeded. While tasks are still pending it only counts the
        backlog (an index count); stats(), which on etcd reads every task, comes at the end.
        The end time comes from the store, not from these polls: they only need to be light,
        so that the benchmark's own reads stay out of the measurement."""
        deadline = time.monotonic() + timeout
        while True:
            if (await store.backlog(["default"])).pending == 0:
                stats = await store.stats()
                done = sum(q.get(str(TaskState.SUCCEEDED), 0) for q in stats.counts.values())
                if done >= n:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all {n} tasks done after {timeout}s")
            await asyncio.sleep(0.25)

    # -- measurements ----------------------------------------------------------------------
    async def submit(self) -> None:
        _, store = await self.fresh()
        try:
            single = 500 if self.args.quick else 2_000
            t = time.perf_counter()
            for _ in range(single):
                await store.submit([bt.app.build_spec(self.noop)])
            one = single / (time.perf_counter() - t)
            specs = [bt.app.build_spec(self.noop) for _ in range(self.n)]
            t = time.perf_counter()
            for i in range(0, len(specs), 1_000):
                await store.submit(specs[i : i + 1_000])
            batch = self.n / (time.perf_counter() - t)
        finally:
            await store.close()
        self.results["submit_single_per_s"] = round(one)
        self.results["submit_batch_per_s"] = round(batch)
        _say(f"  submit: {one:,.0f}/s one at a time, {batch:,.0f}/s in batches of 1,000")

    async def drain(self, processes: int) -> None:
        url, store = await self.fresh()
        procs = await self.experts(url, processes)
        try:
            await self.wait_live(store, processes, procs)
            # Every task falls due at one moment after the submission is all in: a store that
            # writes a big submission in several transactions (etcd) must not get a head start.
            per_s = float(self.results.get("submit_batch_per_s") or 2_000)
            lead = 0.5 + 1.5 * self.n / per_s
            specs = [bt.app.build_spec(self.noop, delay=lead) for _ in range(self.n)]
            await store.submit(specs)
            ends = [await store.get(specs[i].id) for i in (0, -1)]
            t0 = min(t.run_at for t in ends)
            if await store.now() >= t0:
                raise RuntimeError(f"submitting {self.n:,} tasks took longer than {lead:.1f}s")
            await asyncio.sleep(t0 - await store.now())  # nothing is due before t0
            before = _cpu_seconds([p.pid for p in procs])
            await self.wait_done(store, self.n)
            after = _cpu_seconds([p.pid for p in procs])
            tasks = await store.list_tasks(state=TaskState.SUCCEEDED, limit=self.n)
            t1 = max(t.updated_at for t in tasks)
        finally:
            await self.stop(procs)
            await store.close()
        rate = self.n / (t1 - t0)
        self.results[f"drain_{processes}p_per_s"] = round(rate)
        cpu = ""
        if before is not None and after is not None:
            # the experts' CPU time while they drained (on SQLite that is the store's too),
            # steadier than wall time on a shared machine
            us = (after - before) / self.n * 1e6
            self.results[f"drain_{processes}p_cpu_us"] = round(us, 1)
            cpu = f", experts' CPU {us:,.0f} µs/task"
        _say(
            f"  drain: {self.n:,} no-op tasks with {processes} expert process(es) "
            f"(concurrency {self.concurrency}): {rate:,.0f} tasks/s{cpu}"
        )

    async def latency(self, processes: int = 1, concurrency: int = 8) -> None:
        """One stamp task at a time on idle experts: from just before the submit call to the
        task's first line, which the task sends over UDP (as the peers' tasks do, so that this
        process waits on no notification of the store and only submits, as a producer does)."""
        url, store = await self.fresh()
        procs = await self.experts(url, processes, concurrency=concurrency)
        samples: list[float] = []
        calls: list[float] = []
        try:
            await self.wait_live(store, processes, procs)
            count = 100 if self.args.quick else 300
            warm_up = 20  # the first tasks open connections and warm caches: not counted
            async with _Stamps() as stamps:
                for n in range(warm_up + count):
                    # a random gap so the submit lands anywhere in the expert's wait cycle
                    await asyncio.sleep(random.uniform(0.0, 0.01))
                    sent = time.time()
                    began = time.perf_counter()
                    await store.submit([bt.app.build_spec(self.stamp, [n, stamps.port])])
                    call = time.perf_counter() - began
                    started = await stamps.wait(n, procs)
                    if n >= warm_up:
                        samples.append((started - sent) * 1000)
                        calls.append(call * 1000)
        finally:
            await self.stop(procs)
            await store.close()
        samples.sort()
        p50 = statistics.median(samples)
        p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
        self.results["latency_p50_ms"] = round(p50, 2)
        self.results["latency_p99_ms"] = round(p99, 2)
        self.results["submit_call_p50_ms"] = round(statistics.median(calls), 2)
        _say(
            f"  idle submit-to-start latency over {len(samples)} tasks: p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms; one submit call p50 {statistics.median(calls):.2f} ms"
        )

    async def memory(self) -> None:
        url, store = await self.fresh()
        (proc,) = await self.experts(url, 1)
        try:
            await self.wait_live(store, 1, [proc])
            # The first part is as big as one submission of the rest (5,000), so that the
            # expert holds then what it holds later: its running tasks and up to 1,024 claimed
            # ahead (runtime.claimer.AHEAD_MOST). After a first 1,000 it never had, and on etcd
            # at concurrency 512 the ratio measured that stock (x1.45), not a leak.
            first = MEMORY_BATCH if self.n >= 4 * MEMORY_BATCH else 1_000
            await store.submit([bt.app.build_spec(self.noop) for _ in range(first)])
            await self.wait_done(store, first)
            after_first = _peak_rss_kib(proc.pid)
            rest = [bt.app.build_spec(self.noop) for _ in range(self.n - first)]
            for i in range(0, len(rest), MEMORY_BATCH):
                await store.submit(rest[i : i + MEMORY_BATCH])
            await self.wait_done(store, self.n)
            after_all = _peak_rss_kib(proc.pid)
        finally:
            await self.stop([proc])
            await store.close()
        self.results[f"rss_peak_after_{first // 1000}k_mib"] = round(after_first / 1024, 1)
        self.results[f"rss_peak_after_{self.n // 1000}k_mib"] = round(after_all / 1024, 1)
        self.results["rss_growth_ratio"] = round(after_all / after_first, 3)
        _say(
            f"  expert peak memory: {after_first / 1024:.1f} MiB after {first:,} tasks, "
            f"{after_all / 1024:.1f} MiB after {self.n:,} (x{after_all / after_first:.2f})"
        )


def _cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU time of *pids* so far (None where /proc cannot tell)."""
    total = 0.0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return total


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc (this benchmark needs Linux)")


async def _purge(store: Store) -> None:
    purge = getattr(store, "purge_all", None)
    if purge is None:
        raise RuntimeError(f"{store.url}: this backend cannot be emptied for a benchmark")
    await purge()
    compact = getattr(store, "compact_history", None)
    if compact is not None:  # etcd: start each measurement from a compacted history
        await compact()


def _backend(url: str | None) -> str:
    return urlsplit(url).scheme if url else "sqlite"


def machine_speed(seconds: float = 1.0) -> int:
    """A fixed piece of pure-Python work (JSON round trips of a small task-like record) per
    second, on one core: the same machine type has run 2-3x slower on some days, and this
    figure, taken with each backend's run, tells a slow machine from a slow change."""
    record = {"id": "01a22f58a50294aae5ac870999c8", "state": "running", "fence": 3, "h": [1.5]}
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            json.loads(json.dumps(record))
        done += 1000
    return round(done / (time.perf_counter() - start))


async def run_bench(args: argparse.Namespace) -> int:
    bench = Bench(args)
    backend = _backend(args.store)
    _say(
        f"contend bench on {backend} ({os.cpu_count()} cores, Python {platform.python_version()}), "
        f"{bench.n:,} tasks per run"
    )
    bench.results["machine_json_per_s"] = speed = machine_speed()
    _say(f"  machine speed: {speed:,} JSON round trips/s on one core")
    try:
        # latency first, on a fresh store: after the drains the database is busy catching up
        # (WAL checkpoints, PostgreSQL's autovacuum), which is not an idle system
        await bench.latency()
        await bench.submit()
        for n in args.processes:
            await bench.drain(n)
        await bench.memory()
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    if not args.quick:
        _write(Path(args.out), backend, bench.results, bench.n, bench.concurrency, bench.body)
        _say(f"wrote {args.out} and {Path(args.out).with_suffix('.json')}")
    return 0


def _write(
    md_path: Path, backend: str, results: dict[str, Any], n: int, concurrency: int, body: str
) -> None:
    json_path = md_path.with_suffix(".json")
    data: dict[str, Any] = {}
    if json_path.exists():
        data = json.loads(json_path.read_text())
    data[backend] = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "tasks": n,
        "expert_concurrency": concurrency,
        "task_body": body,
        **results,
    }
    md_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    old = md_path.read_text() if md_path.exists() else ""
    if f"<!-- begin {PAGE_SECTION} -->" in old:  # only its own section: the rest is by hand
        md_path.write_text(put_section(old, PAGE_SECTION, render_markdown(data)))
        return
    # A page from before the section: it was all this function's, but for the marked
    # sections other benchmarks wrote into it.
    kept = marked_sections(old)
    page = put_section("", PAGE_SECTION, render_markdown(data)).lstrip("\n")
    md_path.write_text(page + "".join("\n" + block + "\n" for block in kept))


#: The section of the page that ``contend bench`` writes; what lies outside the marked sections
#: is written by hand and kept.
PAGE_SECTION = "bench"

_SECTION = re.compile(r"^<!-- begin (\S+) -->\n.*?^<!-- end \1 -->$", re.M | re.S)


def marked_sections(text: str) -> list[str]:
    """The sections other benchmarks wrote into the page, each between a
    ``<!-- begin NAME -->`` and an ``<!-- end NAME -->`` line, in page order."""
    return [m.group(0) for m in _SECTION.finditer(text)]


def put_section(text: str, name: str, body: str) -> str:
    """*text* with the section *name* replaced by *body* (appended if it has none)."""
    block = f"<!-- begin {name} -->\n{body.strip()}\n<!-- end {name} -->"
    pattern = re.compile(
        rf"^<!-- begin {re.escape(name)} -->\n.*?^<!-- end {re.escape(name)} -->$", re.M | re.S
    )
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip("\n") + "\n\n" + block + "\n"


#: The targets the project's issues set for this 2-core machine: (key, backend, test, text).
TARGETS: list[tuple[str, str, Callable[[float], bool], str]] = [
    ("drain_2p_per_s", "sqlite", lambda v: v >= 8_000, "SQLite drain with 2 processes ≥ 8,000/s"),
    ("latency_p99_ms", "sqlite", lambda v: v <= 20, "SQLite idle latency p99 ≤ 20 ms"),
    ("drain_best_per_s", "postgresql", lambda v: v >= 11_000, "PostgreSQL drain ≥ 11,000/s"),
    ("latency_p99_ms", "postgresql", lambda v: v <= 5, "PostgreSQL idle latency p99 ≤ 5 ms"),
    ("drain_best_per_s", "etcd", lambda v: v >= 3 * 2_345, "etcd drain ≥ 3 × 2,345/s (seed 003)"),
    ("rss_growth_ratio", "*", lambda v: v <= 1.2, "expert memory flat: growth ≤ ×1.2"),
]

ROWS = [
    ("machine_json_per_s", "machine speed: JSON round trips/s, one core (higher: faster)"),
    ("submit_single_per_s", "submit, one task per call (tasks/s)"),
    ("submit_batch_per_s", "submit, batches of 1,000 (tasks/s)"),
    ("drain_1p_per_s", "drain, 1 expert process (tasks/s)"),
    ("drain_1p_cpu_us", "experts' CPU per task, 1 process (µs)"),
    ("drain_2p_per_s", "drain, 2 expert processes (tasks/s)"),
    ("drain_2p_cpu_us", "experts' CPU per task, 2 processes (µs)"),
    ("drain_4p_per_s", "drain, 4 expert processes (tasks/s)"),
    ("drain_4p_cpu_us", "experts' CPU per task, 4 processes (µs)"),
    ("latency_p50_ms", "idle submit-to-start p50 (ms)"),
    ("latency_p99_ms", "idle submit-to-start p99 (ms)"),
    ("submit_call_p50_ms", "one submit call of one task, p50 (ms)"),
    ("rss_peak_after_1k_mib", "expert peak RSS after 1,000 tasks (MiB)"),
    ("rss_peak_after_5k_mib", "expert peak RSS after 5,000 tasks (MiB)"),
    ("rss_peak_after_20k_mib", "expert peak RSS after 20,000 tasks (MiB)"),
    ("rss_growth_ratio", "memory growth, first submission → all tasks (×)"),
]


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and value < 100:
        return f"{value:g}"
    return f"{int(value):,}"


def render_markdown(data: dict[str, Any]) -> str:
    backends = [b for b in ("sqlite", "postgresql", "etcd") if isinstance(data.get(b), dict)]
    for r in (data[b] for b in backends):
        drains = [v for k, v in r.items() if k.startswith("drain_") and k.endswith("p_per_s")]
        r["drain_best_per_s"] = max(drains) if drains else None
    lines = [
        "# Benchmarks",
        "",
        "Written by `contend bench` (`make bench`, or `contend bench --store URL` per backend); the",
        "same figures are in `benchmarks.json`. Every figure comes from real expert processes on",
        "this 2-core machine with fencing on, each backend measured in one run. *Drain*: N no-op",
        "tasks submitted in one call, all due at one moment after the call returned (etcd writes a",
        "big submission in several transactions: no expert starts before it is all in), timed from",
        "that moment to the last completion as the store recorded it; *experts' CPU* is their user",
        "and system time meanwhile (on SQLite the store's work is in it; a server's is not). *Latency*: from submit to",
        "the task's first line, one task at a time on an idle system. The benchmark client, the",
        "experts and the database share the two cores. *Machine speed* is a fixed piece of",
        "pure-Python work timed at the start of each backend's run: machines of this type have run",
        "two to three times slower on some days, so compare figures taken at similar speeds.",
        "",
        "| measure | " + " | ".join(backends) + " |",
        "|---|" + "---:|" * len(backends),
    ]
    for key, label in ROWS:
        values = [data[b].get(key) for b in backends]
        if any(v is not None for v in values):
            lines.append(f"| {label} | " + " | ".join(_fmt(v) for v in values) + " |")
    lines += [
        "| expert concurrency | "
        + " | ".join(str(data[b].get("expert_concurrency", "")) for b in backends)
        + " |",
        "| task body | "
        + " | ".join(str(data[b].get("task_body", "async")) for b in backends)
        + " |",
        "| measured (UTC) | " + " | ".join(data[b]["measured_at"] for b in backends) + " |",
        "",
        "## Against the targets",
        "",
        "| target | measured | met |",
        "|---|---:|:---:|",
    ]
    for key, backend, ok, text in TARGETS:
        for b in backends if backend == "*" else [backend]:
            value = data.get(b, {}).get(key) if b in backends else None
            if value is None:
                continue
            label = text if backend != "*" else f"{text} ({b})"
            lines.append(f"| {label} | {_fmt(value)} | {'yes' if ok(value) else '**no**'} |")
    for b in backends:
        data[b].pop("drain_best_per_s", None)
    extra = data.get("_notes")
    if isinstance(extra, list):
        lines += ["", *extra]
    return "\n".join(lines) + "\n"
