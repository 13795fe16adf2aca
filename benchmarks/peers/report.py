"""The peers benchmark's tables: printed, and written to docs/benchmarks.md (section ``peers``)
with the figures as JSON beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SETUP = """\
Each system drains the same no-op tasks and runs the same one-task-at-a-time latency probe, in
a child process of its own, on a fresh store (a PostgreSQL database `bench_…` on a throwaway
server with stock settings, autovacuum on (`scripts/with-pg.sh`),
an SQLite file in a temporary folder, a Huey name of its own on the local Redis). The systems
take turns within each repetition (contend, peer, contend, peer, …, the order reversed on every
other repetition). The peers come from PyPI into a throwaway virtualenv (`scripts/bench-venv.sh`,
`.bench-venv/`, versions pinned in `benchmarks/peers/requirements.txt`), each at its defaults:

- **PgQueuer** 1.6 (asyncpg): two worker processes, each a `QueueManager.run()` with its
  defaults (batches of 10, LISTEN/NOTIFY, no concurrency limit), async task functions; bulk
  enqueue is one `Queries.enqueue` call with lists.
- **Procrastinate** 3.10 (psycopg): two worker processes, each `run_worker_async()` with its
  defaults (concurrency 1, LISTEN/NOTIFY with a 5 s polling fallback), async task functions; bulk
  enqueue is `batch_defer_async`.
- **Huey** 3.5 on SQLite (`SqliteHuey`: WAL, no fsync) and on Redis (`RedisHuey` at
  127.0.0.1:6379, blocking pops): one consumer with two worker processes (`workers=2,
  worker_type="process"`, the only setting changed, to match contend's two expert processes;
  polling from 0.1 s backing off to 10 s when idle, as it comes), plain task functions. Huey has
  no bulk enqueue: `noop.map()` enqueues one task at a time.
- **contend** (this checkout): two `contend expert` processes at each shape: sync and async
  bodies at the default concurrency (8) and at a tuned one (32 on SQLite, 64 on PostgreSQL, 512
  on etcd); the code of `contend bench` (`Bench.latency`, `Bench.drain`).

*Drain*: contend's tasks all fall due at one moment after their submission is in, timed from
then to the last completion the store recorded; a peer's workers are started and held at a
start line while the tasks are enqueued, then let go at once, timed until the queue is empty
(polled every 5 ms; Huey's last two tasks may still be running then, a few µs each). A peer drain
still running after its time limit gives the rate of the part done. *CPU per task*: user +
system time from `/proc` over the drain, of the worker processes (all threads, Huey's worker
processes included) plus the store's server processes on this host: the PostgreSQL backends of
the bench database (contend's figure includes the bench's own poll, 4 light queries a second;
a peer's leaves its 5 ms poll out), the Redis server, the etcd server; PostgreSQL's own
background processes (WAL writer, checkpointer, autovacuum) are not counted. CPU time is
steadier than wall time on this shared 2-core machine. *Idle latency*: one task at a time after
a random 0-10 ms gap, from just before the submit call to the task's first line, which sends
its start time over UDP (every system alike: the submitting process only submits, and waits on
no notification of the store), after 20 warm-up tasks; *submit call*: how long that one call
took."""


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    if digits:
        return f"{v:.{digits}f}"
    return f"{v:,.0f}"


#: What contend must reach at its default shape (2 expert processes x concurrency 8), sync and
#: async bodies alike, on this 2-core machine: (backend, median key, at least?, bound, unit).
TARGETS: list[tuple[str, str, bool, float, str]] = [
    ("sqlite", "drain_per_s", True, 20_000, "tasks/s"),
    ("postgresql", "drain_per_s", True, 15_000, "tasks/s"),
    ("etcd", "drain_per_s", True, 10_000, "tasks/s"),
    ("sqlite", "latency_p99_ms", False, 5, "ms"),
    ("postgresql", "latency_p99_ms", False, 5, "ms"),
    ("etcd", "latency_p99_ms", False, 10, "ms"),
    ("sqlite", "submit_call_p50_ms", False, 1.5, "ms"),
    ("postgresql", "submit_call_p50_ms", False, 1.5, "ms"),
]
_MEASURE = {
    "drain_per_s": "drain",
    "latency_p99_ms": "idle p99",
    "submit_call_p50_ms": "one submit call p50",
}


def against_targets(summary: dict[str, Any]) -> list[str]:
    """The contend rows at the default shape against :data:`TARGETS` (empty when the run
    measured none of them)."""
    lines: list[str] = []
    for backend, key, at_least, bound, unit in TARGETS:
        for s in summary["systems"]:
            value = s["median"].get(key)
            if s["kind"] != "contend" or s["backend"] != backend or value is None:
                continue
            if "(default)" not in s["shape"]:
                continue
            met = value >= bound if at_least else value <= bound
            target = f"{'≥' if at_least else '≤'} {_f(bound, 0 if bound >= 100 else 1)} {unit}"
            body = s["shape"].split(" body")[0]
            lines.append(
                f"| {backend}, {body}, {_MEASURE[key]} | {target} "
                f"| {_f(value, 0 if value >= 100 else 2)} | {'yes' if met else '**no**'} |"
            )
    if not lines:
        return []
    return [
        "",
        "contend at its default shape (2 × 8) against the targets of issue 14 (this machine):",
        "",
        "| backend, body, measure | target | measured | met |",
        "|---|---|---:|:---:|",
        *lines,
    ]


def tables(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| system | backend | shape | drain (tasks/s) | CPU µs/task (workers + server) "
        "| idle p50 (ms) | idle p99 (ms) | submit call p50 (ms) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in summary["systems"]:
        m = s["median"]
        cpu = f"{_f(m['cpu_us'])} ({_f(m['workers_us'])} + {_f(m['server_us'])})"
        lines.append(
            f"| {'**' + s['kind'] + '**' if s['kind'] == 'contend' else s['kind']} "
            f"| {s['backend']} | {s['shape']} | {_f(m['drain_per_s'])} | {cpu} "
            f"| {_f(m['latency_p50_ms'], 2)} | {_f(m['latency_p99_ms'], 2)} "
            f"| {_f(m['submit_call_p50_ms'], 2)} |"
        )
    lines += [
        "",
        "Ratios contend / peer of the medians (drain: above 1 is contend faster; CPU, p99 and "
        "submit call: below 1 is contend cheaper or quicker):",
        "",
        "| contend shape | peer | drain × | CPU per task × | idle p99 × | submit call × |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in summary["ratios"]:
        cells = [
            _f(r[k], 2) for k in ("drain_per_s", "cpu_us", "latency_p99_ms", "submit_call_p50_ms")
        ]
        lines.append(f"| {r['contend']} | {r['peer']} | " + " | ".join(cells) + " |")
    return lines + against_targets(summary)


def markdown(summary: dict[str, Any]) -> str:
    mode = "quick run (1 repetition)" if summary["quick"] else f"{summary['runs']} repetitions"
    head = [
        "## contend against its peers, same machine, same run",
        "",
        f"Written by `python -m benchmarks.peers` (`make bench`); measured {summary['measured_at']} "
        f"at commit {summary['commit']}, {mode}, {summary['tasks']:,} tasks per drain, medians "
        f"over the repetitions; figures per run in `benchmarks-peers.json`. Machine-speed probe "
        f"(`contend.cli.bench.machine_speed`, JSON round trips/s on one core, about 180,000 on a "
        f"quiet day): {summary['machine_json_per_s_before']:,} before, "
        f"{summary['machine_json_per_s_after']:,} after; load average "
        f"{summary['loadavg_before']} before, {summary['loadavg_after']} after (other sessions "
        "share this 2-core machine: compare the ratios, which come from one run, rather than "
        "absolute figures from different runs).",
        "",
    ]
    return "\n".join(
        head + tables(summary) + ["", "How each system was set up and measured:", "", SETUP]
    )


def print_summary(summary: dict[str, Any]) -> None:
    print("\n".join(["", "medians:", *tables(summary)]), flush=True)


def write(summary: dict[str, Any], json_path: Path, md_path: Path) -> None:
    from contend.cli.bench import put_section

    json_path.write_text(json.dumps(summary, indent=2) + "\n")
    text = md_path.read_text() if md_path.exists() else "# Benchmarks\n"
    md_path.write_text(put_section(text, "peers", markdown(summary)))
