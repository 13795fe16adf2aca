"""The sustained-load tables (printed, and the ``sustained`` section of docs/benchmarks.md),
the JSON beside them, and the chart (drawn by :mod:`benchmarks.sustained.chart` in the bench
virtualenv, where matplotlib is)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.peers.common import ROOT

METHOD = """\
A producer submits `stamp` tasks at a fixed rate (every 10 ms, in one call, as many as the
rate owes by then: about 10 a call at 1,000/s) to two workers at the default shape (contend: 2
expert processes × concurrency 8 unless the table says otherwise; PgQueuer: 2 worker processes
at its defaults, as in the peers table). *Pickup latency*: from the submit call to the task's
first line (the task sends its key back over UDP), by the window (10 s) in which the task was
submitted; tasks never started by the end are *not done*. *Held back*: from 20 % to 70 % of the
run a separate connection holds cleanup back: on PostgreSQL `BEGIN; SELECT txid_current();` and
then idle in that transaction, so vacuum can remove no row version that died after it began; on
SQLite an open read transaction, so no checkpoint can move the WAL past it (etcd has no such
thing and runs without). *Settled*: seconds after the holding session ended until the first
10-s window whose p99 is within twice the p99 before the hold (and 5 ms): back to normal at
the grain of these tables. *Recovery*: until the first 1-s bucket from which on every
bucket's p99 is within that limit, to the end of the run (one slow second anywhere later
moves it); `–` if that did not happen before the run ended. *Slow seconds*: how many 1-s buckets before
the hold, and after it, have a p99 over that same limit, of how many: one slow second late in
the run makes *recovery* long, and this says whether such seconds are any more common after
the hold than before it. *Store size*: PostgreSQL
`pg_total_relation_size` of every table, SQLite the database and WAL files, etcd its `dbSize`;
at the start, the largest, and at the end. After the producer stops the run waits up to the
tail time for the rest to start."""


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


def _ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def rows(summary: dict[str, Any]) -> list[str]:
    out = [
        "| system | cleanup held back | done / submitted | pickup p50 (ms) | p99 (ms) "
        "| worst 10-s window p99 (ms) | p99 before / while / after held (ms) | settled / recovery (s) "
        "| slow seconds before / after held | store size start → max → end (MiB) | measured |",
        "|---|---|---:|---:|---:|---:|---|---:|---|---|---|",
    ]
    for r in summary["results"]:
        worst = max((w["p99_ms"] or 0 for w in r["windows"]), default=None)
        phases = "–"
        if r["hold"] and "hold_p99_ms" in r:
            phases = " / ".join(
                _ms(r.get(k)) for k in ("before_hold_p99_ms", "hold_p99_ms", "after_hold_p99_ms")
            )
        sizes = [s["bytes"] for s in r["sizes"]] or [0]
        rec, settled = r.get("recovery_s"), r.get("settled_s")
        rec_cell = "–" if rec is None or not r["hold"] else f"{rec:.0f}"
        if r["hold"] and "settled_s" in r:
            rec_cell = f"{'–' if settled is None else f'{settled:.0f}'} / {rec_cell}"
        slow = r.get("slow_seconds") if r["hold"] else None
        slow_cell = (
            "–"
            if not slow
            else " / ".join(f"{o} of {n}" for o, n in (slow["before"], slow["after"]))
        )
        out.append(
            f"| {r['system']} | {'yes' if r['hold'] else 'no'} | {r['done']:,} / "
            f"{r['submitted']:,} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | {_ms(worst)} "
            f"| {phases} | {rec_cell} | {slow_cell} "
            f"| {_mib(sizes[0])} → {_mib(max(sizes))} → {_mib(sizes[-1])} "
            f"| {r.get('commit', summary['commit'])}, {r.get('measured_at', summary['measured_at'])} |"
        )
    return out


def windows(summary: dict[str, Any]) -> list[str]:
    """p50/p99 per 10-s window, one line per run (the chart shows the same)."""
    out = ["| system | held back | p50 / p99 per 10-s window (ms) |", "|---|---|---|"]
    for r in summary["results"]:
        cells = ", ".join(f"{_ms(w['p50_ms'])}/{_ms(w['p99_ms'])}" for w in r["windows"])
        out.append(f"| {r['system']} | {'yes' if r['hold'] else 'no'} | {cells} |")
    return out


def markdown(summary: dict[str, Any], svg: str) -> str:
    mode = "quick run" if summary["quick"] else "full run"
    head = [
        "## Sustained load",
        "",
        f"Written by `python -m benchmarks.sustained` (`make bench`); last run "
        f"{summary['measured_at']} at commit {summary['commit']} (each run's own in the table; "
        f"`--merge` keeps the runs of cases not run again), {mode}: "
        f"{summary['rate']:,.0f} tasks/s for {summary['duration_s']:,.0f} s per run; figures per "
        f"window in `benchmarks-sustained.json`. Machine-speed probe "
        f"{summary['machine_json_per_s_before']:,} before, {summary['machine_json_per_s_after']:,} "
        f"after; load average {summary['loadavg_before']} before, {summary['loadavg_after']} after "
        "(a shared 2-core machine: other sessions' work lands in these figures). PostgreSQL "
        "cases run on a throwaway server with stock settings, autovacuum on "
        "(`make bench-sustained`: `scripts/with-pg.sh`).",
        "",
    ]
    chart = [f"![pickup latency per window]({svg})", ""]
    return "\n".join(head + rows(summary) + ["", *chart, *windows(summary), "", METHOD])


def print_table(summary: dict[str, Any]) -> None:
    print("\n".join(["", *rows(summary)]), flush=True)


def write(summary: dict[str, Any], json_path: Path, md_path: Path, svg: Path, python: str) -> None:
    from contend.cli.bench import put_section

    json_path.write_text(json.dumps(summary, indent=1) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [python, "-m", "benchmarks.sustained.chart", str(json_path), str(svg)],
        check=True, cwd=ROOT, env=env,
    )  # fmt: skip
    text = md_path.read_text() if md_path.exists() else "# Benchmarks\n"
    rel = os.path.relpath(svg, md_path.parent)
    md_path.write_text(put_section(text, "sustained", markdown(summary, rel)))
