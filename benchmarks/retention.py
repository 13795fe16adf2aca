"""Does the store stay flat with retention? One million tasks through SQLite and PostgreSQL.

``python -m benchmarks.retention [--tasks 1000000] [--window 50000] [--retention 20]
[--backends sqlite,postgresql] [--quick]`` runs one expert (in this process, concurrency 64,
retention ``--retention`` seconds, so its housekeeping prunes as it goes) while a submitter
keeps about two windows of no-op tasks queued. After each window it reads how many task rows
and history lines the store holds and its size on disk (SQLite: the file and its WAL;
PostgreSQL: the tasks and history tables with their indexes), and times 200 claims of a probe
session (``Store.claim`` of one task, then its completion). Flat means: rows, size and claim
latency of the last windows are those of the first ones, while the count of tasks done grows
by a million. Figures go to ``docs/retention.json`` and a table in ``docs/benchmarks.md``
(a section that ``make bench`` keeps); ``--no-write`` skips that.

``make bench-retention`` runs it on a throwaway PostgreSQL server with stock settings
(``scripts/with-pg.sh``): without autovacuum (as on this project's CI machine) no table can stay
flat, whatever contend deletes. The server's autovacuum setting is written with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from benchmarks import commit
from contend import App, Expert
from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import Completion, ExpertInfo, Store
from contend.store.registry import open_store

ROOT = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def backend(name: str, tmp: Path) -> AsyncIterator[str]:
    if name == "sqlite":
        yield f"sqlite:///{tmp / 'retention.db'}"
    else:
        from contend.testing.postgres import fresh_database

        async with fresh_database() as url:
            yield url


async def footprint(store: Store, name: str, url: str) -> tuple[int, int, int]:
    """(task rows, history lines, bytes on disk)."""
    if name == "sqlite":
        db = store._db.conn  # type: ignore[attr-defined]
        rows = db.execute("SELECT count(*) FROM tasks").fetchone()[0]
        events = db.execute("SELECT count(*) FROM task_events").fetchone()[0]
        path = url.removeprefix("sqlite:///")
        size = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
        return rows, events, size
    pool = store._db._pool  # type: ignore[attr-defined]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM contend.tasks), (SELECT count(*) FROM contend.task_events),"
            " pg_total_relation_size('contend.tasks') + pg_total_relation_size('contend.task_events')"
        )
        r = await cur.fetchone()
    return int(r[0]), int(r[1]), int(r[2])


async def autovacuum(url: str) -> str:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (await conn.execute("SELECT current_setting('autovacuum')")).fetchone()
    return str(row[0]) if row else "?"


async def probe(store: Store, n: int = 200) -> list[float]:
    """Milliseconds per claim of one task by a session of its own (each then completed)."""
    session = await store.register_expert(ExpertInfo("probe", task_types=("probe",)), 30.0)
    await store.submit([TaskSpec.build("probe", queue="probe") for _ in range(n)])
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        got = await store.claim(
            "probe", session, ["probe"], Capabilities(), limit=1, lease_ttl=30.0
        )
        out.append((time.perf_counter() - t0) * 1000)
        for c in got:
            await store.complete("probe", [Completion(c.id, c.fence, "null")])
    await store.deregister_expert("probe", session)
    return out


async def run_one(name: str, tasks: int, window: int, retention: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="contend-retention-") as tmp:
        async with backend(name, Path(tmp)) as url:
            app = App(url)

            @app.task(name="noop")
            async def noop() -> None:
                return None

            store = await open_store(url)
            expert = Expert(app, name="r", concurrency=64, retention=retention)
            runner = asyncio.create_task(expert.run())
            rows: list[dict[str, Any]] = []
            submitted, began = 0, time.monotonic()
            cpu0 = time.process_time()
            try:
                while submitted < tasks or expert.stats.tasks_done < tasks:
                    # keep about two windows queued ahead of the expert
                    while submitted < tasks and submitted - expert.stats.tasks_done < 2 * window:
                        n = min(1000, tasks - submitted)
                        await store.submit([TaskSpec.build("noop") for _ in range(n)])
                        submitted += n
                        await asyncio.sleep(0)
                    if expert.stats.tasks_done >= (len(rows) + 1) * window or (
                        expert.stats.tasks_done >= tasks
                    ):
                        count, events, size = await footprint(store, name, url)
                        ms = await probe(store)
                        q = statistics.quantiles(ms, n=100)
                        row = {
                            "done": expert.stats.tasks_done,
                            "seconds": round(time.monotonic() - began, 1),
                            "task_rows": count,
                            "history_lines": events,
                            "bytes": size,
                            "claim_ms_p50": round(statistics.median(ms), 3),
                            "claim_ms_p99": round(q[98], 3),
                        }
                        rows.append(row)
                        print(
                            f"{name:10} {row['done']:>9,} done  {count:>8,} rows  "
                            f"{events:>9,} history  {size / 2**20:7.1f} MiB  claim p50 "
                            f"{row['claim_ms_p50']:.2f} p99 {row['claim_ms_p99']:.2f} ms  "
                            f"({row['seconds']:.0f}s)",
                            flush=True,
                        )
                        if expert.stats.tasks_done >= tasks:
                            break
                    await asyncio.sleep(0.2)  # polling a counter between windows
            finally:
                expert.stop()
                await runner
                await store.close()
                await app.aclose()
            wall = time.monotonic() - began
            return {
                "backend": name,
                "autovacuum": await autovacuum(url) if name == "postgresql" else None,
                "tasks": tasks,
                "retention_s": retention,
                "wall_s": round(wall, 1),
                "tasks_per_s": round(tasks / wall),
                "cpu_ms_per_task": round((time.process_time() - cpu0) * 1000 / tasks, 3),
                "windows": rows,
            }


def table(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        w = r["windows"]
        first, last = w[0], w[-1]
        peak_rows = max(x["task_rows"] for x in w)
        peak_mib = max(x["bytes"] for x in w) / 2**20
        late = [x["bytes"] / 2**20 for x in w if x["done"] >= r["tasks"] / 2] or [0.0]
        lines.append(
            f"| {r['backend']} | {r['tasks']:,} | {r['retention_s']:g} s | {r['tasks_per_s']:,} "
            f"| {r['cpu_ms_per_task']:.3f} | {first['task_rows']:,} → {last['task_rows']:,} "
            f"(peak {peak_rows:,}) | {first['bytes'] / 2**20:.0f} → {last['bytes'] / 2**20:.0f} "
            f"(peak {peak_mib:.0f}) | {min(late):.0f}–{max(late):.0f} "
            f"| {first['claim_ms_p50']:.2f} / {first['claim_ms_p99']:.2f} → "
            f"{last['claim_ms_p50']:.2f} / {last['claim_ms_p99']:.2f} |"
        )
    return "\n".join(lines)


def write(results: list[dict[str, Any]]) -> None:
    sha = commit()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc = {"date": when, "commit": sha, "results": results}
    (ROOT / "docs" / "retention.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_doc(doc)


def pg_autovacuum(doc: dict[str, Any]) -> str:
    said = {r.get("autovacuum") for r in doc["results"] if r["backend"] == "postgresql"}
    return "/".join(sorted(str(x) for x in said)) or "not measured"


def write_doc(doc: dict[str, Any]) -> None:
    """The section of docs/benchmarks.md (kept when ``make bench`` rewrites the page)."""
    from contend.cli.bench import put_section

    body = (
        "## Retention: a million tasks through one store\n\n"
        f"`python -m benchmarks.retention`, {doc['date']}, commit {doc['commit']}: one expert "
        "in the benchmark's process (concurrency 64, `retention` as shown, so its housekeeping "
        "prunes as it goes), no-op tasks, two windows of 50,000 queued ahead; after each window "
        "the task rows and the size on disk (queued tasks included), and 200 claims of one task "
        "by a probe session. PostgreSQL: a throwaway server with stock settings "
        f"(autovacuum {pg_autovacuum(doc)}; `make bench-retention`). Every window is in "
        "docs/retention.json.\n\n"
        "| backend | tasks | retention | tasks/s | CPU ms/task | task rows first → last | "
        "MiB first → last | MiB over the second half | claim ms p50 / p99, first → last "
        "window |\n"
        "|---|---:|---:|---:|---:|---|---|---|---|\n"
        f"{table(doc['results'])}\n\n"
        "The first window counts the 100,000 tasks queued ahead; the rows of the later windows "
        "are what the retention keeps plus that queue. Read the JSON for the shape: flat is "
        "the later windows staying level while the tasks done keep growing (the second half's "
        "sizes). Task rows go up and down by the tasks of one pruning round: a caught-up expert "
        "prunes again after 30 s. Where the tasks/s "
        "is lower than without retention, pruning took its share of the expert's time.\n"
    )
    md = ROOT / "docs" / "benchmarks.md"
    md.write_text(put_section(md.read_text(), "retention", body))


def main() -> int:
    if os.environ.get("CONTEND_LOG_LEVEL"):
        import logging

        logging.basicConfig(level=os.environ["CONTEND_LOG_LEVEL"])
    p = argparse.ArgumentParser(prog="python -m benchmarks.retention")
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--window", type=int, default=50_000)
    p.add_argument("--retention", type=float, default=20.0)
    p.add_argument("--backends", default="sqlite,postgresql")
    p.add_argument("--quick", action="store_true", help="50,000 tasks in windows of 5,000")
    p.add_argument("--no-write", action="store_true")
    p.add_argument(
        "--rewrite-doc", action="store_true", help="only rewrite the doc from docs/retention.json"
    )
    a = p.parse_args()
    if a.rewrite_doc:
        write_doc(json.loads((ROOT / "docs" / "retention.json").read_text()))
        return 0
    if a.quick:
        a.tasks, a.window = 50_000, 5_000
    results = []
    for name in a.backends.split(","):
        results.append(asyncio.run(run_one(name, a.tasks, a.window, a.retention)))
    print(table(results))
    if not a.no_write and not a.quick:
        write(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
