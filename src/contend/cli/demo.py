"""``contend demo``: several expert processes, a log-analysis workload, one expert killed with
SIGKILL half-way, live progress, and a closing report that checks every commit."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from contend.demo import tasks as demo
from contend.domain.task import TaskState
from contend.errors import ConfigError
from contend.store.port import Store
from contend.store.registry import open_store

LEASE = 2.0
EXPERT_PROFILES = [
    # name suffix, capabilities, concurrency
    ("alpha", ["geo", "ssd"], 4),
    ("bravo", ["ssd"], 4),
    ("charlie", ["geo"], 4),
    ("delta", [], 4),
]


@dataclass
class DemoRun:
    url: str
    workdir: str
    total: int = 0
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    killed: str | None = None
    killed_at: float = 0.0
    killed_tasks: list[str] = field(default_factory=list)
    recovered_at: float | None = None
    caps: dict[str, list[str]] = field(default_factory=dict)  # expert -> its capabilities


def _say(text: str = "") -> None:
    print(text, flush=True)


async def _start_expert(
    run: DemoRun, name: str, caps: list[str], concurrency: int, window: float
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "contend",
        "--log-level",
        "INFO",
        "expert",
        "contend.demo.tasks:app",
        "--store",
        run.url,
        "--name",
        name,
        "--concurrency",
        str(concurrency),
        "--lease",
        str(LEASE),
        "--grace",
        "5",
        "--window",
        str(window),
    ]
    for c in caps:
        cmd += ["--capability", c]
    run.caps[name] = list(caps)
    log = open(os.path.join(run.workdir, f"{name}.log"), "wb")  # noqa: SIM115, ASYNC230
    run.procs[name] = await asyncio.create_subprocess_exec(
        *cmd, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL
    )
    log.close()


def _workload(app_tasks: Any, n: int) -> list[Any]:
    """Mostly log chunks, some geo summaries (need the ``geo`` capability), a few long reports."""
    specs = []
    reports = max(2, n // 500)
    geo = n // 5
    for i in range(n - reports - geo):
        specs.append(demo.app.build_spec(demo.parse_logs, [i, 400], priority=0))
    for i in range(geo):
        specs.append(demo.app.build_spec(demo.geo_summary, [10_000 + i, 300]))
    for d in range(reports):
        specs.append(demo.app.build_spec(demo.daily_report, [d + 1, 40], priority=5))
    return specs


def _progress(done: int, total: int, rate: float, extra: str) -> str:
    width = 30
    filled = int(width * done / max(1, total))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>6}/{total} {rate:7.0f}/s  {extra}"


async def _counts(store: Store) -> dict[str, int]:
    stats = await store.stats()
    out: dict[str, int] = {}
    for q in stats.counts.values():
        for state, n in q.items():
            out[state] = out.get(state, 0) + n
    return out


async def _kill_one(run: DemoRun, store: Store) -> None:
    """SIGKILL the expert holding the most running tasks (preferring one with a long report),
    among those whose unfinished work another expert could still do: killing the only ``geo``
    expert while geo tasks remain would leave them with nobody to run them."""
    running = await store.list_tasks(state=TaskState.RUNNING, limit=100_000)
    unfinished = list(running)
    for state in (TaskState.CLAIMED, TaskState.PENDING):
        unfinished += await store.list_tasks(state=state, limit=100_000)
    by_owner: dict[str, list[Any]] = {}
    for t in running:
        if t.owner in run.procs and _replaceable(run, t.owner, unfinished):
            by_owner.setdefault(t.owner, []).append(t)
    if not by_owner:
        return
    victim = max(
        by_owner,
        key=lambda o: (any(t.type == "daily_report" for t in by_owner[o]), len(by_owner[o])),
    )
    # Freeze the victim first, so that what it holds cannot change between the listing and the
    # kill; if it finished everything in between, let it go on and try again later.
    proc = run.procs[victim]
    proc.send_signal(signal.SIGSTOP)
    held = [t.id for t in by_owner[victim] if not (await store.get(t.id)).state.terminal]
    if not held:
        proc.send_signal(signal.SIGCONT)
        return
    proc.send_signal(signal.SIGKILL)
    run.killed, run.killed_at = victim, time.monotonic()
    run.killed_tasks = held
    await proc.wait()


async def run_demo(args: argparse.Namespace) -> int:
    own_dir = tempfile.mkdtemp(prefix="contend-demo-")
    url = args.store or f"sqlite:///{os.path.join(own_dir, 'demo.db')}"
    run = DemoRun(url=url, workdir=own_dir)
    store = await open_store(url)
    started = time.monotonic()
    try:
        await _check_empty(store, url)
        await _submit(store, run, _workload(demo, args.tasks), args.experts)
        await _start_experts(run, args.experts, args.window)
        elapsed = await _watch(store, run, kill=not args.no_kill)
        await _stop_experts(run)
        report = await _report(store, run, elapsed, time.monotonic() - started)
        _print_report(report, json_out=args.json)
        return 0 if report["ok"] else 1
    finally:
        await _clean_up(run, store, remove_dir=args.store is None)


async def _check_empty(store: Store, url: str) -> None:
    existing = sum(sum(q.values()) for q in (await store.stats()).counts.values())
    if existing:
        raise ConfigError(
            f"the demo needs an empty store, and {url} already holds {existing} task(s); "
            "leave out --store to use a new SQLite file"
        )


async def _submit(store: Store, run: DemoRun, specs: list[Any], experts: int) -> None:
    """Describe the workload, then submit it in batches of 1,000."""
    run.total = len(specs)
    _say(f"contend demo: {experts} experts contend for {run.total} tasks on {run.url}")
    _say(
        f"  workload: {sum(s.type == 'parse_logs' for s in specs)} log chunks to parse, "
        f"{sum(s.type == 'geo_summary' for s in specs)} geo summaries (need capability 'geo'), "
        f"{sum(s.type == 'daily_report' for s in specs)} long reports that checkpoint"
    )
    t0 = time.perf_counter()
    for i in range(0, len(specs), 1000):
        await store.submit(specs[i : i + 1000])
    _say(f"  submitted in {time.perf_counter() - t0:.2f}s; starting experts (lease {LEASE:.0f}s)")


def _replaceable(run: DemoRun, name: str, unfinished: list[Any]) -> bool:
    """Whether every unfinished task could still run on some other live expert."""
    others = [set(caps) for n, caps in run.caps.items() if n != name and _alive(run, n)]
    return all(any(t.requirements.tags <= caps for caps in others) for t in unfinished)


def _alive(run: DemoRun, name: str) -> bool:
    return name in run.procs and run.procs[name].returncode is None


async def _start_experts(run: DemoRun, experts: int, window: float) -> None:
    profiles = [EXPERT_PROFILES[i % len(EXPERT_PROFILES)] for i in range(experts)]
    for i, (suffix, caps, conc) in enumerate(profiles):
        await _start_expert(run, f"demo-{suffix}{'' if i < 4 else i}", caps, conc, window)


async def _watch(store: Store, run: DemoRun, *, kill: bool) -> float:
    """Show progress until every task has ended (or 300 s passed), SIGKILLing one expert once
    35 % have succeeded if *kill*; return the seconds it took."""
    begin = time.monotonic()
    tty = sys.stdout.isatty()
    last_line = 0.0
    while True:
        counts = await _counts(store)
        finished = sum(counts.get(s, 0) for s in ("succeeded", "failed", "dead", "cancelled"))
        done = counts.get("succeeded", 0)
        now = time.monotonic()
        if kill and run.killed is None and done >= run.total * 0.35:
            await _kill_and_say(run, store, tty)
        if run.killed and run.recovered_at is None and run.killed_tasks:
            await _note_recovery(run, store, now, tty)
        rate = done / max(1e-6, now - begin)
        live = sum(1 for p in run.procs.values() if p.returncode is None)
        extra = f"running {counts.get('running', 0):>3}  experts {live}"
        if tty:
            print("\r" + _progress(done, run.total, rate, extra), end="", flush=True)
        elif now - last_line >= 1.0:
            _say("  " + _progress(done, run.total, rate, extra))
            last_line = now
        if finished >= run.total:
            break
        if now - begin > 300:
            _say("\n  gave up waiting after 300s")
            break
        await asyncio.sleep(0.2)
    elapsed = time.monotonic() - begin
    if tty:
        print()
    return elapsed


async def _kill_and_say(run: DemoRun, store: Store, tty: bool) -> None:
    await _kill_one(run, store)
    if run.killed:
        msg = (
            f"  !! SIGKILL {run.killed} while it held {len(run.killed_tasks)} task(s); "
            f"its lease lapses within {LEASE:.0f}s and others take over"
        )
        _say(("\n" if tty else "") + msg)


async def _note_recovery(run: DemoRun, store: Store, now: float, tty: bool) -> None:
    """Once every task the killed expert held has ended, say how long that took."""
    states = [(await store.get(t)).state for t in run.killed_tasks]
    if all(s.terminal for s in states):
        now = max(now, time.monotonic())
        run.recovered_at = now
        _say(
            ("\n" if tty else "") + f"  recovered: all {len(run.killed_tasks)} task(s) of "
            f"{run.killed} finished elsewhere {now - run.killed_at:.2f}s after the kill"
        )


async def _stop_experts(run: DemoRun) -> None:
    """SIGTERM the experts still running (they drain and leave) and wait for them all."""
    for proc in run.procs.values():
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    await asyncio.gather(*(p.wait() for p in run.procs.values()))


async def _clean_up(run: DemoRun, store: Store, *, remove_dir: bool) -> None:
    """Kill any expert left, close the store, and remove the demo's own directory unless
    ``CONTEND_DEMO_KEEP`` is set."""
    for proc in run.procs.values():
        if proc.returncode is None:
            proc.kill()
    await store.close()
    if remove_dir and not os.environ.get("CONTEND_DEMO_KEEP"):
        shutil.rmtree(run.workdir, ignore_errors=True)


async def _report(store: Store, run: DemoRun, elapsed: float, wall: float) -> dict[str, Any]:
    tasks = await store.list_tasks(limit=10_000_000)
    wrong: list[str] = []
    twice: list[str] = []
    resumed: list[dict[str, Any]] = []
    for t in tasks:
        if t.state != TaskState.SUCCEEDED:
            continue
        if t.type == "parse_logs" and t.result != demo.aggregate(*t.args):
            wrong.append(t.id)
        if t.type == "daily_report" and t.result and t.result.get("resumed_at"):
            resumed.append(
                {
                    "id": t.id,
                    "day": t.args[0],
                    "resumed_at": t.result["resumed_at"],
                    "of": t.args[1],
                    "fence": t.result["fence"],
                }
            )
    check = [t.id for t in tasks if t.state == TaskState.SUCCEEDED]
    for tid in check[: min(len(check), 20_000)]:
        history = (await store.get(tid, history=True)).history
        if sum(1 for e in history if e.event == "succeeded") != 1:
            twice.append(tid)
    stats = await store.stats()
    attempts = sum(e.claim_attempts for e in stats.experts)
    won = sum(e.claims_won for e in stats.experts)
    states: dict[str, int] = {}
    for t in tasks:
        states[str(t.state)] = states.get(str(t.state), 0) + 1
    ok = states.get("succeeded", 0) == run.total and not wrong and not twice
    return {
        "ok": ok,
        "store": run.url,
        "tasks": run.total,
        "states": states,
        "results_wrong": len(wrong),
        "committed_more_than_once": len(twice),
        "checked_exactly_once": len(check),
        "killed_expert": run.killed,
        "killed_held": len(run.killed_tasks),
        "recovery_seconds": None
        if run.recovered_at is None
        else round(run.recovered_at - run.killed_at, 3),
        "lease_seconds": LEASE,
        "resumed_from_checkpoint": resumed,
        "elapsed_seconds": round(elapsed, 2),
        "wall_seconds": round(wall, 2),
        "throughput_per_s": round(states.get("succeeded", 0) / max(elapsed, 1e-6), 1),
        "competition": {
            "claim_attempts": attempts,
            "claims_won": won,
            "success_rate": round(won / attempts, 4) if attempts else None,
        },
        "per_expert": {e.info.id: e.tasks_done for e in stats.experts},
    }


def _print_report(r: dict[str, Any], *, json_out: bool) -> None:
    if json_out:
        print(json.dumps(r, indent=2))
        return
    _say()
    _say("report")
    _say(
        f"  tasks           {r['states'].get('succeeded', 0)}/{r['tasks']} succeeded"
        + "".join(f", {n} {s}" for s, n in r["states"].items() if s != "succeeded")
    )
    _say(
        f"  exactly once    {r['checked_exactly_once'] - r['committed_more_than_once']}/"
        f"{r['checked_exactly_once']} committed exactly once; {r['results_wrong']} wrong results"
    )
    if r["killed_expert"]:
        rec = r["recovery_seconds"]
        _say(
            f"  crash           {r['killed_expert']} SIGKILLed holding {r['killed_held']} task(s); "
            + (
                f"all finished by others {rec:.2f}s later (lease {r['lease_seconds']:.0f}s)"
                if rec is not None
                else "not recovered!"
            )
        )
    for res in r["resumed_from_checkpoint"]:
        _say(
            f"  checkpoint      report day {res['day']} resumed at step {res['resumed_at']}/{res['of']} "
            f"under fence {res['fence']}"
        )
    _say(f"  throughput      {r['throughput_per_s']:.0f} tasks/s over {r['elapsed_seconds']:.1f}s")
    comp = r["competition"]
    rate = comp["success_rate"]
    _say(
        f"  competition     {'-' if rate is None else f'{rate:.1%}'} of claim attempts won "
        f"({comp['claims_won']}/{comp['claim_attempts']})"
    )
    _say("  per expert      " + ", ".join(f"{k} {v}" for k, v in sorted(r["per_expert"].items())))
    _say(
        f"  verdict         {'OK' if r['ok'] else 'PROBLEMS FOUND'}  (total {r['wall_seconds']:.1f}s)"
    )
