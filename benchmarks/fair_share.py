"""Fair share: one tenant's burst against another tenant's trickle, on four experts.

``python -m benchmarks.fair_share [--backends sqlite,postgresql] [--burst 100000] [--rate 20]
[--seconds 30] [--quick] [--no-write]`` measures issue 16 §5 ("one tenant's 100,000-task
burst must not delay another tenant's tasks by more than its share"). Per backend and per case
— ``fair`` (``@app.task(fair=True, limit_key="tenant:{tenant}")``) and ``plain`` (the same
work without fair share: first in, first out) — on a fresh store: tenant A submits ``--burst``
tasks in batches of 1,000, four ``contend expert`` processes (concurrency 8) start on them, and
once A's drain is under way tenant B submits one task at a time at ``--rate`` a second for
``--seconds``. A third, short case, ``alone``, is B's trickle on idle experts: what B's pickup
takes with no burst at all, the figure the fair case is to be held against.

B's pickup latency is submit to claim, the task's ``created_at`` to its history's first
claim (both the store's clock): p50/p95/p99/max over the trickle and per ``--window`` seconds
of it. A's drain rate is the tasks that succeeded during the trickle (the store's counts,
sampled every second, less B's), a second. CPU is the experts' (``/proc/PID/stat``: user + system, children included) over the
trickle, per task done in it. A backend that refuses fair tasks (ConfigError on submission) is
reported as not supported yet. The figures are printed and written to ``docs/fair_share.json``
and a section of ``docs/benchmarks.md`` (``--no-write`` skips that; ``--quick`` runs a
10,000-task burst for 10 s and writes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import commit
from benchmarks.fair_app import app
from benchmarks.recovery import processes, until
from contend.domain.task import TaskState
from contend.errors import ConfigError
from contend.store.port import Store
from contend.store.registry import open_store

ROOT = Path(__file__).resolve().parent.parent
APP = "benchmarks.fair_app:app"
TASKS = {"fair": "fair_work", "plain": "plain_work", "alone": "fair_work"}
BATCH = 1_000
#: How long the ``alone`` case trickles at most, seconds.
ALONE_SECONDS = 10.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process *pid* and its waited-for children, seconds (0: gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return sum(int(f) for f in fields[11:15]) / TICK  # utime stime cutime cstime


@dataclass
class Sample:
    at: float  # the store's clock
    succeeded: int
    pending: int
    cpu: float


@dataclass
class Run:
    """What one case recorded while it ran."""

    samples: list[Sample] = field(default_factory=list)
    b_ids: list[str] = field(default_factory=list)
    began: float = 0.0  # the store's clock when B's trickle began
    ended: float = 0.0  # and when it ended
    cpu: tuple[float, float] = (0.0, 0.0)  # the experts' CPU then
    #: the machine's 1-minute load average then: the cores are shared with other work
    load: tuple[float, float] = (0.0, 0.0)
    #: (submitted, first claimed, succeeded or None) of each of B's tasks, the store's clock
    b_events: list[tuple[float, float, float | None]] = field(default_factory=list)


async def sample(store: Store, pids: Sequence[int]) -> Sample:
    st = await store.stats()
    count = {s: sum(q.get(s, 0) for q in st.counts.values()) for s in ("succeeded", "pending")}
    cpu = sum(cpu_seconds(p) for p in pids)
    return Sample(st.now, count["succeeded"], count["pending"], cpu)


async def sampler(store: Store, pids: Sequence[int], run: Run, window: float) -> None:
    """Every second, the store's counts and the experts' CPU; every *window*, a line."""
    last_print = time.monotonic()
    while True:
        s = await sample(store, pids)
        run.samples.append(s)
        if time.monotonic() - last_print >= window:
            last_print = time.monotonic()
            print(
                f"    {len(run.b_ids):5} of B submitted, {s.succeeded:7,} succeeded, "
                f"{s.pending:7,} pending, experts' CPU {s.cpu:6.1f} s",
                flush=True,
            )
        await asyncio.sleep(1.0)


async def submit_burst(store: Store, task: str, n: int) -> None:
    """Tenant A's burst, in batches; the first batch raises ConfigError where a backend
    keeps no fair share (nothing is written then)."""
    for lo in range(0, n, BATCH):
        await store.submit([app.build_spec(task, ["a", k]) for k in range(lo, min(n, lo + BATCH))])
        if (lo + BATCH) % 20_000 == 0:
            print(f"    A: {lo + BATCH:,} submitted", flush=True)


async def trickle(store: Store, task: str, rate: float, seconds: float, run: Run) -> None:
    """Tenant B: one task per submission, at *rate* a second, for *seconds*."""
    start = time.monotonic()
    for k in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + k / rate - time.monotonic()))
        (got,) = await store.submit([app.build_spec(task, ["b", k])])
        run.b_ids.append(got.id)


async def wait_claimed(store: Store, ids: Sequence[str], timeout: float) -> None:
    """Until every task of *ids* has been claimed (it is no longer pending)."""
    left = list(ids)

    async def none_left() -> bool:
        while left:
            if (await store.get(left[-1])).state == TaskState.PENDING:
                await asyncio.sleep(0.2)
                return False
            left.pop()
        return True

    await until(none_left, timeout, "B's tasks to be claimed")


async def run_case(url: str, case: str, args: argparse.Namespace, logdir: Path) -> Run:
    """One case on a fresh store at *url*; raises ConfigError if it refuses the tasks."""
    task, run = TASKS[case], Run()
    burst = 0 if case == "alone" else args.burst
    seconds = min(args.seconds, ALONE_SECONDS) if case == "alone" else args.seconds
    store = await open_store(url)
    try:
        await store.submit([app.build_spec(task, ["probe", 0])])  # ConfigError: not kept
        await submit_burst(store, task, burst)
        base = [sys.executable, "-m", "contend", "expert", APP, "--store", url]
        cmds = [
            [*base, "--name", f"e{n}", "--concurrency", str(args.concurrency)] for n in range(4)
        ]
        with processes(cmds, logdir) as procs:
            pids = [p.pid for p in procs]

            async def ready() -> bool:
                live = sum(e.alive for e in await store.list_experts()) >= len(cmds)
                return live and (await sample(store, pids)).succeeded >= min(burst, 1_000) + 1

            await until(ready, 120, "four live experts draining A's burst")
            watch = asyncio.create_task(sampler(store, pids, run, args.window))
            try:
                first = await sample(store, pids)
                run.began, run.cpu = first.at, (first.cpu, 0.0)
                run.load = (os.getloadavg()[0], 0.0)
                run.samples.append(first)
                await trickle(store, task, args.rate, seconds, run)
                last = await sample(store, pids)
                run.ended, run.cpu = last.at, (run.cpu[0], last.cpu)
                run.load = (run.load[0], os.getloadavg()[0])
                run.samples.append(last)
                rate = max(1.0, (last.succeeded - first.succeeded) / (last.at - first.at))
                await wait_claimed(store, run.b_ids, 120 + 3 * last.pending / rate)
            finally:
                watch.cancel()
        run.b_events = await histories(store, run.b_ids)
    finally:
        await store.close()
    return run


async def histories(store: Store, ids: Sequence[str]) -> list[tuple[float, float, float | None]]:
    """(created, first claimed, succeeded or None) of each task, on the store's clock."""
    out = []
    for tid in ids:
        task = await store.get(tid, history=True)
        at: dict[str, float] = {}
        for e in task.history:
            ev = "claimed" if e.event == "started" else e.event
            at[ev] = min(at.get(ev, e.at), e.at)
        out.append((task.created_at, at["claimed"], at.get("succeeded")))
    return out


# -- figures -----------------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: float) -> float:
    """The nearest-rank *q* quantile of *xs* (sorted)."""
    return xs[max(0, min(len(xs) - 1, math.ceil(q * len(xs)) - 1))]


def latency(ms: Sequence[float]) -> dict[str, float | int]:
    xs = sorted(ms)
    if not xs:
        return {"n": 0}
    out: dict[str, float | int] = {"n": len(xs)}
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        out[f"{name}_ms"] = round(percentile(xs, q), 1)
    out["max_ms"] = round(xs[-1], 1)
    return out


def succeeded_at(samples: Sequence[Sample], t: float) -> float:
    """The store's succeeded count at *t*, between the samples either side of it."""
    ats = [s.at for s in samples]
    i = bisect.bisect_left(ats, t)
    if i == 0:
        return samples[0].succeeded
    if i == len(samples):
        return samples[-1].succeeded
    a, b = samples[i - 1], samples[i]
    return a.succeeded + (b.succeeded - a.succeeded) * (t - a.at) / max(b.at - a.at, 1e-9)


def a_rate(run: Run, samples: Sequence[Sample], lo: float, hi: float) -> float:
    """A's tasks that succeeded from *lo* to *hi*, a second: all the store's, less B's."""
    b_done = sum(1 for _, _, done in run.b_events if done is not None and lo <= done < hi)
    done = succeeded_at(samples, hi) - succeeded_at(samples, lo) - b_done
    return round(max(0.0, done) / max(hi - lo, 1e-9), 1)


def figures(run: Run, window: float) -> dict[str, Any]:
    """One case's figures: B's pickup overall and per window, A's drain, CPU per task."""
    samples = sorted(run.samples, key=lambda s: s.at)
    ms = [(c - s) * 1000 for s, c, _ in run.b_events]
    windows = []
    span = run.ended - run.began
    for w in range(max(1, math.ceil(span / window - 1e-6))):
        lo, hi = run.began + w * window, min(run.ended, run.began + (w + 1) * window)
        got = [(c - s) * 1000 for s, c, _ in run.b_events if lo <= s < hi]
        windows.append(
            {
                "from_s": round(lo - run.began, 1),
                **latency(got),
                "a_per_s": a_rate(run, samples, lo, hi),
            }
        )
    done = succeeded_at(samples, run.ended) - succeeded_at(samples, run.began)
    cpu = run.cpu[1] - run.cpu[0]
    return {
        "b": latency(ms),
        "a_per_s": a_rate(run, samples, run.began, run.ended),
        "done_per_s": round(done / max(span, 1e-9), 1),
        "cpu_s": round(cpu, 2),
        "cpu_us_per_task": round(cpu / done * 1e6, 1) if done else None,
        "seconds": round(span, 2),
        "pending_after": samples[-1].pending,
        "load_average": [round(x, 2) for x in run.load],
        "windows": windows,
    }


# -- backends, report, main --------------------------------------------------------------------


@asynccontextmanager
async def backend(name: str, tmp: Path) -> AsyncIterator[str]:
    """A fresh, empty store of backend *name*."""
    if name == "sqlite":
        yield f"sqlite:///{tmp / 'fair.db'}"
    elif name == "postgresql":
        from contend.testing.postgres import fresh_database

        async with fresh_database() as url:
            yield url
    elif name == "etcd":
        from contend.testing.etcd_server import EtcdServer

        server = EtcdServer()
        server.start()
        try:
            yield f"{server.url}/fair"
        finally:
            server.close()
    else:
        raise SystemExit(f"unknown backend {name!r} (sqlite, postgresql, etcd)")


async def measure(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every case on backend *name*, each on a fresh store; {"supported": False, ...} where
    the backend refuses fair tasks."""
    out: dict[str, Any] = {}
    for case in ("fair", "plain", "alone"):
        print(f"{name} / {case} ...", flush=True)
        where = tmp / f"{name}-{case}"
        where.mkdir()
        async with backend(name, where) as url:
            try:
                run = await run_case(url, case, args, where)
            except ConfigError as exc:
                print(f"  {name}: not supported yet ({exc})", flush=True)
                return {"supported": False, "reason": str(exc)}
        out[case] = got = figures(run, args.window)
        b = got["b"]
        print(
            f"  B pickup p50 {b.get('p50_ms')} / p99 {b.get('p99_ms')} / max {b.get('max_ms')} ms; "
            f"A {got['a_per_s']:,}/s; {got['cpu_us_per_task']} µs CPU/task",
            flush=True,
        )
    return out


def cell(v: float | None) -> str:
    return "–" if v is None else f"{v:,}"


def ratio(a: float | None, b: float | None) -> str:
    return f"×{a / b:.2f}" if a and b else "–"


ROWS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("B pickup p50, ms", lambda f: f["b"].get("p50_ms")),
    ("B pickup p95, ms", lambda f: f["b"].get("p95_ms")),
    ("B pickup p99, ms", lambda f: f["b"].get("p99_ms")),
    ("B pickup max, ms", lambda f: f["b"].get("max_ms")),
    ("B tasks", lambda f: f["b"].get("n")),
    ("A drained, tasks/s", lambda f: f["a_per_s"]),
    ("experts' CPU, µs/task", lambda f: f["cpu_us_per_task"]),
]


def table(name: str, got: dict[str, Any]) -> str:
    """One backend's side-by-side table, markdown."""
    if not got.get("fair"):
        return f"| {name} | not supported yet: {got.get('reason', '')} |\n|---|---|"
    lines = [
        f"| {name} | fair | plain | plain / fair | B alone |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, pick in ROWS:
        f, p, a = (pick(got[c]) for c in ("fair", "plain", "alone"))
        a_text = cell(a) if label.startswith("B ") else "–"  # alone: A idle, CPU that of idling
        lines.append(f"| {label} | {cell(f)} | {cell(p)} | {ratio(p, f)} | {a_text} |")
    loads = (
        f"{c} {got[c]['load_average'][0]:g} → {got[c]['load_average'][1]:g}"
        for c in ("fair", "plain", "alone")
        if "load_average" in got[c]
    )
    return "\n".join(lines) + "\n\nLoad average (1 min) over B's trickle: " + ", ".join(loads)


def windows(got: dict[str, Any]) -> str:
    """B's p99 and A's rate per window, fair against plain."""
    lines = [
        "| from, s | fair: B p99 ms | fair: A /s | plain: B p99 ms | plain: A /s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for f, p in zip(got["fair"]["windows"], got["plain"]["windows"], strict=False):
        lines.append(
            f"| {f['from_s']:g} | {f.get('p99_ms', '–')} | {f['a_per_s']:,} | "
            f"{p.get('p99_ms', '–')} | {p['a_per_s']:,} |"
        )
    return "\n".join(lines)


def write(results: dict[str, Any], meta: dict[str, Any]) -> None:
    from contend.cli.bench import put_section

    docs = ROOT / "docs"
    (docs / "fair_share.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    parts = []
    for name, got in results.items():
        parts.append(table(name, got))
        if got.get("fair"):
            parts.append(f"Per {meta['window']:g} s of B's trickle, {name}:\n\n{windows(got)}")
    body = (
        "## Fair share: two tenants on four experts\n\n"
        f"`python -m benchmarks.fair_share`, {meta['date']}, commit {meta['commit']}, "
        f"{meta['host']} ({meta['cpus']} cores, shared). Issue 16 §5: one tenant's burst must "
        "not delay another tenant's tasks by more than its share. Four `contend expert` "
        f"processes (concurrency {meta['concurrency']}); tenant A submits {meta['burst']:,} "
        "tasks (batches of 1,000, before the experts start), then, while A's burst drains, "
        f"tenant B submits one task at a time, {meta['rate']:g} a second for "
        f"{meta['seconds']:g} s. Each task sleeps 1 ms. *fair*: "
        '`@app.task(fair=True, limit_key="tenant:{tenant}")`; *plain*: the same task without '
        "fair share (first in, first out); *B alone*: B's trickle on idle experts, no burst "
        f"(at most {ALONE_SECONDS:g} s). B's pickup is submit to first claim, both from the "
        "task's history on the store's clock; A's rate is its tasks that succeeded during "
        "B's trickle; CPU is the four experts' (user + system) over the trickle, per task "
        "done in it. Every figure is in docs/fair_share.json.\n\n" + "\n\n".join(parts) + "\n"
    )
    md = docs / "benchmarks.md"
    md.write_text(put_section(md.read_text(), "fair-share", body))


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fair_share", description=__doc__)
    p.add_argument("--backends", default="sqlite")
    p.add_argument("--burst", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--quick", action="store_true", help="a 10,000-task burst, 10 s; no report")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.burst, args.seconds, args.no_write = 10_000, 10.0, True
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="contend-fair-") as tmp:
        for name in args.backends.split(","):
            results[name] = await measure(name, args, Path(tmp))
    for name, got in results.items():
        print(f"\n{table(name, got)}")
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        **{k: getattr(args, k) for k in ("burst", "rate", "seconds", "concurrency", "window")},
    }
    if not args.no_write:
        write(results, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
