"""The chaos runner: every scenario on every backend it applies to, with progress lines and a
summary; ``--write-doc`` puts the figures into docs/reliability.md.

    python -m contend.testing.chaos              # the full set (make chaos)
    python -m contend.testing.chaos --short      # the short mode (what the test suite runs)
    python -m contend.testing.chaos --scenario kill-9 --backend sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contend.testing.chaos import clock, kills, load, network, restarts, sqlite_faults
from contend.testing.chaos.netns import Link
from contend.testing.chaos.netns import available as netns_available
from contend.testing.chaos.scenario import Run, Size
from contend.testing.chaos.servers import BACKENDS, Backend, SQLiteBackend, make_backend
from contend.testing.chaos.verdict import Figures, judge
from contend.testing.etcd_server import EtcdUnavailable, find_etcd
from contend.testing.pg_cluster import ClusterUnavailable
from contend.testing.pg_cluster import binary as pg_binary

ROOT = Path(__file__).resolve().parents[4]
DOC = ROOT / "docs" / "reliability.md"


@dataclass(frozen=True)
class Scenario:
    """One fault family's scenario. The short mode (the test suite's) runs each on the
    backends of ``short_backends`` only, to stay within a couple of minutes: the others are
    run by ``make chaos``, and by the crash and lease tests of tests/acceptance and
    tests/integration at a smaller scale."""

    name: str
    fault: str  # the table's words for what is injected
    body: Callable[[Run], Awaitable[None]]
    backends: tuple[str, ...]
    short: Size | None  # None: not in the short mode
    full: Size
    link: bool = False  # its experts need a network namespace
    tmpfs: int = 0  # megabytes of a tmpfs of its own for the SQLite file (0: none)
    needs: Callable[[], str | None] | None = None  # what else it needs: None when it is here
    short_backends: tuple[str, ...] | None = None  # the short mode's (None: all of them)
    #: backends where it fails for a bug found and reported, not fixed: a run there that
    #: fails is reported as known; one that passes fails the suite (drop the entry)
    known: dict[str, str] = field(default_factory=dict)
    lease: float = 2.0

    def size(self, short: bool) -> Size | None:
        return self.short if short else self.full


SCENARIOS: list[Scenario] = [
    Scenario(
        "kill-9",
        "kill -9 of random experts, replacements started",
        kills.kill_9,
        BACKENDS,
        short=Size(True, tasks=300, experts=3, rounds=3),
        full=Size(False, tasks=1200, experts=4, rounds=10),
        short_backends=("postgres",),
    ),
    Scenario(
        "sigstop",
        "SIGSTOP past the lease, then SIGCONT",
        kills.sigstop,
        BACKENDS,
        short=Size(True, tasks=90, experts=3, rounds=1),
        full=Size(False, tasks=400, experts=4, rounds=4),
        short_backends=("etcd",),
    ),
    Scenario(
        "restart",
        "store crash and restart mid-run (PostgreSQL -m immediate, etcd kill -9)",
        restarts.restart,
        ("postgres", "etcd"),
        short=Size(True, tasks=200, experts=3, rounds=1),
        full=Size(False, tasks=1000, experts=4, rounds=4),
        short_backends=("etcd",),
    ),
    Scenario(
        "network",
        "network hang and cut (netns) between some experts and the store",
        network.partition,
        ("postgres", "etcd"),
        short=Size(True, tasks=150, experts=4, rounds=1),
        full=Size(False, tasks=800, experts=4, rounds=4),
        link=True,
        short_backends=("postgres",),
    ),
    Scenario(
        "bursts",
        "kill -9 in the middle of write bursts, then PRAGMA integrity_check",
        sqlite_faults.bursts,
        ("sqlite",),
        short=Size(True, tasks=2400, experts=3, rounds=6),
        full=Size(False, tasks=8000, experts=4, rounds=30),
    ),
    Scenario(
        "lock",
        "write lock held by another process past the lease",
        sqlite_faults.lock_held,
        ("sqlite",),
        short=Size(True, tasks=100, experts=3, rounds=1),
        full=Size(False, tasks=600, experts=4, rounds=3),
    ),
    Scenario(
        "disk-full",
        "disk full (a 24 MB tmpfs), then room again",
        sqlite_faults.disk_full,
        ("sqlite",),
        short=Size(True, tasks=300, experts=2, rounds=1),
        full=Size(False, tasks=1500, experts=3, rounds=1),
        tmpfs=24,
    ),
    Scenario(
        "load",
        "20,000 tasks from 3 concurrent submitters, kill -9 of experts and a submitter",
        load.load,
        BACKENDS,
        short=Size(True, tasks=3000, experts=3, rounds=2),
        full=Size(False, tasks=20000, experts=4, rounds=6),
        short_backends=("sqlite", "etcd"),
    ),
    Scenario(
        "clock",
        "the experts' wall clock jumps +1 h, then -1 h (libfaketime), kill -9 after each",
        clock.jump,
        BACKENDS,
        short=Size(True, tasks=300, experts=3, rounds=1),
        full=Size(False, tasks=600, experts=4, rounds=1),
        needs=clock.missing,
        # the bugs it found on SQLite and etcd have cheap reproducers, which make test runs
        # (tests/integration/test_wall_clock.py, tests/integration/etcd/test_wall_clock.py)
        short_backends=("postgres",),
    ),
]


def missing(scenario: Scenario, backend: str) -> str | None:
    """What this machine lacks to run *scenario* on *backend*, or None."""
    if backend == "postgres":
        try:
            pg_binary("initdb")
        except ClusterUnavailable as exc:
            return str(exc)
    if backend == "etcd":
        try:
            find_etcd()
        except EtcdUnavailable as exc:
            return str(exc)
    if scenario.link:
        return netns_available()
    if scenario.tmpfs:
        return sqlite_faults.can_mount()
    return scenario.needs() if scenario.needs else None


def selected(
    names: Sequence[str], backends: Sequence[str], short: bool
) -> list[tuple[Scenario, str]]:
    known = {s.name for s in SCENARIOS}
    unknown = set(names) - known
    if unknown:
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}; known: {sorted(known)}")
    return [
        (s, b)
        for s in SCENARIOS
        if (not names or s.name in names) and s.size(short) is not None
        for b in s.backends
        if (not backends or b in backends)
        and (not short or s.short_backends is None or b in s.short_backends)
    ]


async def run_one(scenario: Scenario, backend_name: str, short: bool, keep: bool) -> Figures:
    size = scenario.size(short)
    assert size is not None
    workdir = Path(tempfile.mkdtemp(prefix=f"contend-chaos-{scenario.name}-{backend_name}-"))
    link = Link().create() if scenario.link else None
    listen = (link.server_host,) if link else ()
    disk = workdir / "disk"
    if scenario.tmpfs:
        sqlite_faults.mount_tmpfs(disk, scenario.tmpfs)
        backend: Backend = SQLiteBackend(workdir, path=disk / "chaos.db")
    else:
        backend = make_backend(backend_name, workdir, listen)
    began = time.monotonic()
    run = Run(backend, workdir, size, lease=scenario.lease, link=link)
    figures: Figures | None = None
    try:
        try:
            backend.start()
            await scenario.body(run)
        except AssertionError as exc:
            run.problems.append(str(exc))
        except Exception as exc:  # a scenario that breaks is a failed scenario, not a crash
            run.problems.append(f"the scenario raised {type(exc).__name__}: {exc}")
        run.experts.stop_all()
        try:
            figures = await judge(run, scenario.name, scenario.fault, time.monotonic() - began)
        except Exception as exc:
            figures = Figures(backend_name, scenario.name, scenario.fault, faults=len(run.faults))
            figures.problems += [*run.problems, f"the checks raised {type(exc).__name__}: {exc}"]
        if not figures.ok:
            figures.notes.append(f"the server: {backend.log_tail()}")
        figures.known = scenario.known.get(backend_name)
        if figures.known and figures.ok:
            figures.notes.append(f"known to fail ({figures.known}) but passed: drop the mark")
        return figures
    finally:
        run.experts.stop_all()
        await run.close()
        backend.close()
        if link is not None:
            link.close()
        if scenario.tmpfs:
            sqlite_faults.unmount(disk)
        if figures is not None and figures.ok and not figures.known and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif figures is not None:
            figures.notes.append(f"logs kept in {workdir}")


async def run_all(pairs: list[tuple[Scenario, str]], short: bool, keep: bool) -> list[Figures]:
    results = []
    for n, (scenario, backend) in enumerate(pairs, 1):
        print(f"[{n}/{len(pairs)}] {scenario.name} on {backend} …", flush=True)
        figures = await run_one(scenario, backend, short, keep)
        print(f"    {figures.line()}", flush=True)
        for problem in figures.problems:
            print(f"    problem: {problem[:2000]}", flush=True)
        for note in figures.notes:
            print(f"    note: {note}", flush=True)
        results.append(figures)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contend.testing.chaos")
    parser.add_argument("--short", action="store_true", help="the short mode (CI)")
    parser.add_argument("--scenario", action="append", default=[], help="only these")
    parser.add_argument("--backend", action="append", default=[], choices=BACKENDS)
    parser.add_argument("--write-doc", action="store_true", help=f"rewrite the table in {DOC}")
    parser.add_argument("--keep", action="store_true", help="keep every scenario's logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the suite's own store client: errors only
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    pairs = selected(args.scenario, args.backend, args.short)
    began = time.monotonic()
    results = asyncio.run(run_all(pairs, args.short, args.keep))
    wall = time.monotonic() - began
    failed = [f for f in results if not f.as_expected]
    known = [f for f in results if f.known and not f.ok]
    print(
        f"\n{sum(f.ok for f in results)} of {len(results)} passed, {len(known)} failed for a "
        f"known bug, {len(failed)} unexpected, in {wall:.0f}s"
    )
    for f in results:
        print(f"  {f.line()}")
    if args.write_doc:
        from contend.testing.chaos.report import commit_of, rewrite, table

        mode = "short" if args.short else "full"
        rewrite(DOC, table(results, mode=mode, commit=commit_of(ROOT), wall=wall))
        print(f"wrote the figures to {DOC}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
