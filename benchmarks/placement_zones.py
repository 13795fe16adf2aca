"""Placement across zones: expert processes in three network namespaces on one PostgreSQL.

``python -m benchmarks.placement_zones [--tasks 300] [--rate 25] [--delay 0.01] [--no-write]``
(root: it makes the namespaces) starts a throwaway PostgreSQL server with stock settings
(:class:`contend.testing.pg_cluster.Cluster`) and three namespaces joined to this one by veth
pairs (:class:`contend.testing.chaos.netns.Link`), each a zone with two ``contend expert``
processes of :mod:`benchmarks.placement_app` (concurrency 2, ``--capability zone:X``,
``--zone-margin``). Zones a and b reach the server directly; zone c, the far one, through a
:class:`~contend.testing.proxy.FaultProxy` that holds every chunk ``--delay`` seconds each way
(20 ms more round trip at the default: this kernel has no ``netem``). Each task prefers the
zone its data is in (a third each, ``prefer=["zone:X"]``), so an expert of another zone waits
the zone margin before it races for it.

The benchmark process submits ``--tasks`` tasks one at a time, Poisson at ``--rate`` a second,
with competition on (the default race window) and then off (``--window 0``, a plain queue),
and reports, per zone: tasks run, the share on an expert four times faster at the task's
kind, the share run in the zone the task prefers, the pickup time (first claim − submit,
store clock) and the experts' claim round trip and claim success (from their heartbeats).
It writes ``docs/placement-zones.md`` and ``docs/placement-zones.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks import commit
from benchmarks import placement_app as pa
from contend.domain.task import TaskState
from contend.store.registry import open_store
from contend.testing.chaos.netns import Link
from contend.testing.pg_cluster import STOCK, Cluster
from contend.testing.proxy import FaultProxy

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
APP = "benchmarks.placement_app:app"
ZONES = ("a", "b", "c")
FAR = "c"
#: zone -> its experts (names as in placement_app.SPEED).
MEMBERS = {"a": ("gpu-0", "th-0"), "b": ("tx-0", "tx-1"), "c": ("th-1", "tx-2")}
MIX = (("thumbnail", 0.40), ("transcode", 0.35), ("infer", 0.25))
MARGIN = 0.05  # seconds an expert of another zone waits for a task that prefers one


def workload(n: int, seed: int) -> list[tuple[str, float, str]]:
    rng = random.Random(seed)
    kinds, weights = [k for k, _ in MIX], [w for _, w in MIX]
    return [
        (rng.choices(kinds, weights)[0], round(rng.uniform(0.5, 1.5), 3), rng.choice(ZONES))
        for _ in range(n)
    ]


def expert_command(name: str, zone: str, url: str, window: float | None) -> list[str]:
    opts = [*pa.EXPERT_OPTS.get(name, []), "--capability", f"zone:{zone}"]
    if window is not None:
        opts += ["--window", str(window)]
    return [
        sys.executable, "-m", "contend", "--log-level", "WARNING", "expert", APP,
        "--store", url, "--name", name, "--concurrency", "2",
        "--zone-margin", str(MARGIN), *opts,
    ]  # fmt: skip


async def run_once(
    urls: dict[str, str], prefixes: dict[str, list[str]], db: str, window: float | None,
    jobs: list[tuple[str, float, str]], rate: float,
) -> dict[str, Any]:  # fmt: skip
    """One run on a fresh database *db*: the experts up, the stream submitted, the figures."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    env.pop("CONTEND_STORE", None)
    here = urls["here"].rsplit("/", 1)[0] + f"/{db}"
    store = await open_store(here)
    procs = []
    try:
        for zone in ZONES:
            url = urls[zone].rsplit("/", 1)[0] + f"/{db}"
            for name in MEMBERS[zone]:
                cmd = [*prefixes[zone], *expert_command(name, zone, url, window)]
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *cmd, env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL
                    )
                )
        deadline = time.monotonic() + 60
        while sum(e.alive for e in await store.list_experts()) < len(procs):
            if time.monotonic() > deadline:
                raise RuntimeError("the experts did not all start within 60 s")
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # every expert hears of its rivals before work arrives
        rng = random.Random(7)
        ids: list[str] = []
        for kind, size, zone in jobs:
            need = {"prefer": [f"zone:{zone}"], **({"tags": ["gpu"]} if kind == "infer" else {})}
            spec = pa.app.build_spec(kind, kwargs={"size": size}, requirements=need)
            ids += [s.id for s in await store.submit([spec])]
            await asyncio.sleep(rng.expovariate(rate))
        deadline = time.monotonic() + 120
        while len(await store.list_tasks(state=TaskState.SUCCEEDED, limit=len(ids))) < len(ids):
            if time.monotonic() > deadline:
                raise RuntimeError("the stream was not done within 120 s of its end")
            await asyncio.sleep(0.1)
        ended = await store.now()
        while True:  # the claim counters as of a heartbeat after the last task
            experts = [e for e in await store.list_experts() if e.alive]
            if all(e.heartbeat_at > ended for e in experts):
                break
            await asyncio.sleep(0.1)
        tasks = [await store.get(tid, history=True) for tid in ids]
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        await asyncio.gather(*(asyncio.wait_for(p.wait(), 60) for p in procs))
        await store.close()
    zone_of = {name: zone for zone, names in MEMBERS.items() for name in names}
    out: dict[str, Any] = {"window": window, "zones": {}}
    for zone in ZONES:
        ran = [t for t in tasks if zone_of[t.result["expert"]] == zone]
        pickup = sorted(
            (min(e.at for e in t.history if e.event in ("claimed", "started")) - t.created_at)
            * 1000
            for t in ran
        )
        mine = [e for e in experts if zone_of.get(e.info.id) == zone]
        attempts = sum(e.claim_attempts for e in mine)
        claim_ms = [float(e.metrics["claim_ms"]) for e in mine if "claim_ms" in e.metrics]
        out["zones"][zone] = {
            "tasks": len(ran),
            "on_a_fast_expert": _share(ran, lambda t: _fast(t)),
            "in_preferred_zone": _share(
                ran, lambda t, z=zone: f"zone:{z}" in t.requirements.prefer
            ),
            "pickup_p50_ms": round(statistics.median(pickup), 1) if pickup else None,
            "pickup_p90_ms": round(pickup[int(len(pickup) * 0.9)], 1) if pickup else None,
            "claim_ms": round(statistics.mean(claim_ms), 2) if claim_ms else None,
            "claim_attempts": attempts,
            "claims_won": sum(e.claims_won for e in mine),
        }
    done = [t.updated_at for t in tasks]
    out["tasks"] = len(tasks)
    out["on_a_fast_expert"] = _share(tasks, _fast)
    out["in_preferred_zone"] = _share(
        tasks, lambda t: f"zone:{zone_of[t.result['expert']]}" in t.requirements.prefer
    )
    out["span_s"] = round(max(done) - min(t.created_at for t in tasks), 2)
    return out


def _fast(t: Any) -> bool:
    return pa.SPEED.get(t.result["expert"], {}).get(t.type, 1.0) > 1.0


def _share(tasks: list[Any], pred: Any) -> float | None:
    return round(sum(1 for t in tasks if pred(t)) / len(tasks), 3) if tasks else None


def _pc(share: float | None) -> str:
    return "–" if share is None else f"{share:.0%}"


def markdown(runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Placement across zones",
        "",
        f"Written by `python -m benchmarks.placement_zones` on {meta['date']} at commit "
        f"{meta['commit']} ({meta['machine']}); the figures are also in `placement-zones.json`."
        " Six `contend expert` processes in three network namespaces (two a zone, concurrency"
        " 2) share one PostgreSQL server; zone c reaches it through a proxy that adds"
        f" {meta['delay'] * 2000:.0f} ms of round trip. {meta['tasks']} tasks arrive one at a"
        f" time, Poisson at {meta['rate']:g}/s; each prefers a zone (a third each), and the"
        f" experts of the other zones wait a zone margin of {MARGIN * 1000:.0f} ms before they"
        " race for it. *Fast*: run by an expert four times faster at its kind. *Pickup*: first"
        " claim − submit, store clock. *Claim*: the experts' claim round trip (moving average)."
        " *Success*: claims won / task ids named in claims.",
        "",
        "| competition | zone | tasks | fast | in its zone | pickup p50 / p90 (ms) | claim (ms)"
        " | claims per task | success |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        mode = "off (`--window 0`)" if run["window"] == 0 else "on (default window)"
        for zone, z in run["zones"].items():
            far = " (far)" if zone == FAR else ""
            per = z["claim_attempts"] / z["tasks"] if z["tasks"] else 0.0
            ok = z["claims_won"] / z["claim_attempts"] if z["claim_attempts"] else 1.0
            lines.append(
                f"| {mode} | {zone}{far} | {z['tasks']} | {_pc(z['on_a_fast_expert'])} "
                f"| {_pc(z['in_preferred_zone'])} | {z['pickup_p50_ms']} / {z['pickup_p90_ms']} "
                f"| {z['claim_ms']} | {per:.2f} | {ok:.0%} |"
            )
        everyone = [z for z in run["zones"].values()]
        tried = sum(z["claim_attempts"] for z in everyone)
        won = sum(z["claims_won"] for z in everyone)
        lines.append(
            f"| {mode} | all | {run['tasks']} | {_pc(run['on_a_fast_expert'])} "
            f"| {_pc(run['in_preferred_zone'])} | | | {tried / run['tasks']:.2f} "
            f"| {won / max(1, tried):.0%} |"
        )
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    jobs = workload(args.tasks, args.seed)
    with ExitStack() as stack:
        links = {z: stack.enter_context(Link(n)) for n, z in enumerate(ZONES)}
        near = [links[z].server_host for z in ZONES if z != FAR]
        cluster = Cluster(listen=near, settings=STOCK)
        cluster.start()
        stack.callback(cluster.close)
        far = FaultProxy(
            "127.0.0.1", cluster.port, host=links[FAR].server_host, delay=args.delay
        ).start()
        stack.callback(far.close)
        base = "postgresql://postgres@{}:{}/postgres"
        urls = {"here": cluster.url, FAR: base.format(far.host, far.port)}
        urls.update({z: base.format(links[z].server_host, cluster.port) for z in ZONES if z != FAR})
        prefixes = {z: links[z].prefix for z in ZONES}
        import psycopg

        runs = []
        for n, window in enumerate((None, 0.0)):
            db = f"zones{n}"
            with psycopg.connect(cluster.url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {db}")
            runs.append(await run_once(urls, prefixes, db, window, jobs, args.rate))
            print(json.dumps(runs[-1]), flush=True)
    return {"runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=300)
    p.add_argument("--rate", type=float, default=25.0)
    p.add_argument("--delay", type=float, default=0.01, help="zone c's added delay each way, s")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    got = asyncio.run(main_async(args))
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": f"{os.cpu_count()} cores, shared",
        "tasks": args.tasks,
        "rate": args.rate,
        "delay": args.delay,
    }
    text = markdown(got["runs"], meta)
    print(text)
    if not args.no_write:
        (DOCS / "placement-zones.json").write_text(
            json.dumps({"meta": meta, **got}, indent=2) + "\n"
        )
        (DOCS / "placement-zones.md").write_text(text)


if __name__ == "__main__":
    main()
