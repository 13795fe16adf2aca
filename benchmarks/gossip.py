"""Gossip for membership and load (issue 13 §3): detection, false suspicions under loss,
convergence after a partition heals, and bytes per member, with the seed's ``max_agents``.

    sudo python benchmarks/gossip.py            # writes docs/gossip.json and docs/gossip.md
    python benchmarks/gossip.py --quick         # fewer rounds and shorter windows

Needs root (network namespaces and iptables; this kernel has no netem) and the gossip extra.
Each member is a process of its own (``contend.testing.gossip_member``), except for the
bandwidth runs, where N members share one process and one namespace's loopback, whose byte
counter is read before and after. Keep it short on a shared machine: the default run takes
about six minutes of mostly idle waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEY = base64.b64encode(secrets.token_bytes(32)).decode()
PORT = 7946


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout}s: {what}")
        time.sleep(0.01)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- detection: kill -9 on loopback ------------------------------------------------------------
def detection(timing: str, rounds: int, n: int = 4) -> dict[str, Any]:
    from contend.testing.gossip_member import MemberProcess

    suspect, dead = [], []
    for _ in range(rounds):
        seed = f"127.0.0.1:{_free_port()}"
        ms = [MemberProcess("m0", bind=seed, seeds=[seed], timing=timing)]
        ms += [MemberProcess(f"m{i}", seeds=[seed], timing=timing) for i in range(1, n)]
        try:
            names = {f"m{i}" for i in range(n)}
            for m in ms:
                wait_until(lambda m=m, names=names: set(m.view() or {}) == names, 20, "join")
            victim = ms[-1]
            t = victim.signal(signal.SIGKILL)
            for m in ms[:-1]:
                wait_until(lambda m=m, v=victim.name, t=t: m.events("dead", v, t), 60, "dead")
                s = m.events("suspect", victim.name, t)
                suspect.append(s[0] - t if s else math.nan)
                dead.append(m.events("dead", victim.name, t)[0] - t)
        finally:
            for m in ms:
                m.stop()
    return {
        "timing": timing,
        "members": n,
        "samples": len(dead),
        "suspect_median_s": round(statistics.median(suspect), 3),
        "dead_median_s": round(statistics.median(dead), 3),
        "dead_worst_s": round(max(dead), 3),
    }


# -- namespaces: loss and partitions -----------------------------------------------------------
def _lan_members(lan: Any, timing: str, loads: dict[str, int]) -> list[Any]:
    from contend.testing.gossip_member import MemberProcess

    seed = f"{lan.address(0)}:{PORT}"
    ms = [
        MemberProcess(
            f"m{i}",
            bind=f"{lan.address(i)}:{PORT}",
            seeds=[seed],
            timing=timing,
            load=loads[f"m{i}"],
            netns=lan.ns(i),
            env={"CONTEND_GOSSIP_KEY": KEY},
        )
        for i in range(lan.n)
    ]
    for m in ms:
        wait_until(lambda m=m: m.view() == loads, 30, f"{m.name} joins")
    return ms


def false_suspicions(timing: str, loss: float, seconds: float, n: int = 4) -> dict[str, Any]:
    from contend.testing.netns import Lan

    loads = {f"m{i}": i for i in range(n)}
    with Lan(n) as lan:
        ms = _lan_members(lan, timing, loads)
        try:
            began = time.time()
            if loss:
                lan.loss(loss)
            time.sleep(seconds)  # an observation window
            ended = time.time()
            lan.heal()
            sus = sum(len([t for t in m.events("suspect", after=began) if t <= ended]) for m in ms)
            dead = sum(len([t for t in m.events("dead", after=began) if t <= ended]) for m in ms)
        finally:
            for m in ms:
                m.stop()
    minutes = n * seconds / 60
    return {
        "timing": timing,
        "loss": loss,
        "members": n,
        "seconds": seconds,
        "suspicions": sus,
        "false_deaths": dead,
        "suspicions_per_member_minute": round(sus / minutes, 2),
    }


def heal(timing: str, rounds: int, n: int = 4) -> dict[str, Any]:
    from contend.testing.netns import Lan

    took = []
    for _ in range(rounds):
        loads = {f"m{i}": i for i in range(n)}
        with Lan(n) as lan:
            ms = _lan_members(lan, timing, loads)
            try:
                left, right = list(range(n // 2)), list(range(n // 2, n))
                lan.cut(left, right)
                for i in left:
                    wait_until(
                        lambda m=ms[i], side=left: set(m.view() or {}) == {f"m{j}" for j in side},
                        60,
                        "the partition is seen",
                    )
                for i in range(n):
                    loads[f"m{i}"] = 100 + i
                    ms[i].send(f"load {100 + i}")
                for i in left:
                    want = {f"m{j}": 100 + j for j in left}
                    wait_until(lambda m=ms[i], want=want: m.view() == want, 10, "side")
                t = time.monotonic()
                lan.heal()
                for m in ms:
                    wait_until(lambda m=m, want=loads: m.view() == want, 120, "converged")
                took.append(time.monotonic() - t)
            finally:
                for m in ms:
                    m.stop()
    return {
        "timing": timing,
        "members": n,
        "rounds": rounds,
        "converged_median_s": round(statistics.median(took), 2),
        "converged_worst_s": round(max(took), 2),
    }


# -- bandwidth: N members in one process, one namespace's loopback -----------------------------
async def _group(n: int, timing: str, port: int) -> None:
    """Run inside the namespace: N members; stdin says ``rate F`` (publishes per second per
    member, 0: none) and ``stop``; stdout says ``ready`` and ``stats``."""
    from contend.gossip import GossipNode, summary
    from contend.store.port import ExpertInfo

    seed = f"127.0.0.1:{port}"
    nodes = [GossipNode("g0", bind=seed, seeds=[seed], timing=timing, min_gap=0.0)]
    nodes += [GossipNode(f"g{i}", seeds=[seed], timing=timing, min_gap=0.0) for i in range(1, n)]
    infos = [ExpertInfo(id=nd.expert, queues=("default",), capacity=8) for nd in nodes]
    sample = {"types": {"app.resize": [120, 2, 0.25], "app.mail": [800, 0, 0.02]}}
    for nd, info in zip(nodes, infos, strict=True):
        nd.publish(summary(info, 0, sample))
        await nd.start()
    deadline = time.monotonic() + 60
    while not all(len(nd.records() or ()) == n for nd in nodes):
        if time.monotonic() > deadline:
            raise TimeoutError("the group did not converge")
        await asyncio.sleep(0.05)
    size = len(json.dumps(summary(infos[0], 3, sample), separators=(",", ":")))
    print(json.dumps({"ev": "ready", "summary_bytes": size}), flush=True)
    rate = 0.0
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    step = 0

    async def publisher() -> None:
        nonlocal step
        while True:
            if rate <= 0:
                await asyncio.sleep(0.1)
                continue
            step += 1
            for k, (nd, info) in enumerate(zip(nodes, infos, strict=True)):
                nd.publish(summary(info, (step + k) % 8, sample))
                await asyncio.sleep(1 / rate / n)  # spread the members over the period

    task = asyncio.create_task(publisher())
    while line := (await reader.readline()).decode().strip():
        word, _, rest = line.partition(" ")
        if word == "rate":
            rate = float(rest)
        elif word == "stats":
            sent = sum(nd.published for nd in nodes)
            print(json.dumps({"ev": "stats", "published": sent}), flush=True)
        elif word == "stop":
            break
    task.cancel()
    for nd in nodes:
        await nd.close(leave=0.2)


def bandwidth(n: int, timing: str, seconds: float, rate: float) -> dict[str, Any]:
    from contend.testing.netns import Lan

    with Lan(1) as lan:
        cmd = ["ip", "netns", "exec", lan.ns(0), sys.executable, __file__, "--group", str(n)]
        cmd += ["--timing", timing]
        p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ)
        )
        assert p.stdin is not None and p.stdout is not None
        try:
            ready = json.loads(p.stdout.readline())

            def window(r: float) -> tuple[float, int]:
                p.stdin.write(f"rate {r}\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                time.sleep(2)  # let the rate take hold, then count
                p.stdin.write("stats\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                before = json.loads(p.stdout.readline())["published"]  # type: ignore[union-attr]
                b0, t0 = lan.tx_bytes(0, "lo"), time.monotonic()
                time.sleep(seconds)
                b1, t1 = lan.tx_bytes(0, "lo"), time.monotonic()
                p.stdin.write("stats\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                after = json.loads(p.stdout.readline())["published"]  # type: ignore[union-attr]
                return (b1 - b0) / (t1 - t0) / n, after - before

            time.sleep(10)  # the join's own rumours drain first
            idle, _ = window(0.0)
            busy, published = window(rate)
            p.stdin.write("stop\n")
            p.stdin.flush()
            p.wait(30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    freq = published / seconds / n  # summaries per second per member, as measured
    # what one member's publish costs every other member, as bytes each member sends
    per_update = (busy - idle) / max(1e-9, (n - 1) * freq) if n > 1 else 0.0
    return {
        "members": n,
        "timing": timing,
        "publish_hz_per_member": round(freq, 3),
        "summary_bytes": ready["summary_bytes"],
        "idle_bytes_per_s_per_member": round(idle),
        "busy_bytes_per_s_per_member": round(busy),
        "bytes_per_update_per_member": round(per_update, 1),
    }


def max_agents(bandwidth_bps: float, overhead_bps: float, size: float, freq: float) -> int:
    """Seed 002: floor((bandwidth − overhead) / (heartbeat_size × freq)); all in bytes/s."""
    return max(0, math.floor((bandwidth_bps - overhead_bps) / (size * freq)))


# -- report -------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--group", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--timing", default="fast", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="10,25,50")
    ap.add_argument("--only-bandwidth", action="store_true", help="rerun the bandwidth part alone")
    args = ap.parse_args()
    if args.group:
        asyncio.run(_group(args.group, args.timing, PORT))
        return 0
    if os.geteuid() != 0:
        print("needs root: network namespaces and iptables", file=sys.stderr)
        return 2
    q = args.quick
    out: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    if args.only_bandwidth:
        out = json.loads((ROOT / "docs" / "gossip.json").read_text())
    else:
        out["detection"] = [detection("fast", 2 if q else 5), detection("lan", 1 if q else 3)]
        print(json.dumps(out["detection"], indent=1), flush=True)
        window = 10 if q else 30
        out["false_suspicions"] = [
            false_suspicions(t, loss, window) for t in ("fast", "lan") for loss in (0.0, 0.05, 0.10)
        ]
        print(json.dumps(out["false_suspicions"], indent=1), flush=True)
        out["heal"] = [heal("fast", 1 if q else 3), heal("lan", 1)]
        print(json.dumps(out["heal"], indent=1), flush=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    seconds = 8 if q else 15
    # at the default heartbeat (a summary per 5 s), and at one a second
    out["bandwidth"] = [bandwidth(n, "lan", seconds, 0.2) for n in sizes]
    out["bandwidth"] += [bandwidth(n, "lan", seconds, 1.0) for n in sizes]
    print(json.dumps(out["bandwidth"], indent=1), flush=True)
    # heartbeat size from the largest cluster at the default heartbeat
    big = max(
        (b for b in out["bandwidth"] if b["publish_hz_per_member"] < 0.5),
        key=lambda b: b["members"],
    )
    size, freq = big["bytes_per_update_per_member"], 1 / 5  # one summary per 5 s heartbeat
    overhead = big["idle_bytes_per_s_per_member"]
    out["max_agents"] = {
        "heartbeat_size_bytes": size,
        "heartbeat_hz": freq,
        "overhead_bytes_per_s": overhead,
        "note": "heartbeat_size: bytes each member sends per update of one other member "
        f"(gossip's redundancy included), measured at {big['members']} members publishing "
        "every 5 s; freq: the "
        "default heartbeat (15 s lease / 3); a link given wholly to gossip",
        "1_gbit": max_agents(1e9 / 8, overhead, size, freq),
        "100_mbit": max_agents(100e6 / 8, overhead, size, freq),
        "1_gbit_at_5_percent": max_agents(0.05 * 1e9 / 8, overhead, size, freq),
    }
    print(json.dumps(out["max_agents"], indent=1), flush=True)
    out["commit"] = commit()
    (ROOT / "docs" / "gossip.json").write_text(json.dumps(out, indent=2) + "\n")
    (ROOT / "docs" / "gossip.md").write_text(report(out))
    return 0


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        return "?"


def report(out: dict[str, Any]) -> str:
    """docs/gossip.md: what gossip is for, how to turn it on, and the figures."""
    rows = lambda items, keys: "\n".join(  # noqa: E731
        "| " + " | ".join(str(i[k]) for k in keys) + " |" for i in items
    )
    m = out["max_agents"]
    cap = max(b["busy_bytes_per_s_per_member"] for b in out["bandwidth"])
    return f"""# Gossip for membership and load

`contend expert … --gossip HOST:PORT,…` makes an expert learn its rivals and their load from
the other experts by gossip, instead of reading every expert's heartbeat from the store at
each of its own heartbeats. N experts reading N rows each is N² rows per heartbeat period:
a million at 1,000 experts. The store stays the only authority for claims, leases and fences.
Each expert still renews its own lease there, and an expert without gossip, or whose gossip
stopped, reads the store as before. Experts with and without gossip can share a store.

- **Failure detection**: SWIM with indirect probes, suspicion, refutation by incarnation and
  the Lifeguard extensions, by [kinship](https://pypi.org/project/kinship/) (the `gossip`
  extra: `pip install 'contend[gossip]'`). swim-protocol was turned down because it sends
  pickle on the wire. kinship runs its protocol on a thread of its own, so a busy event loop
  does not get an expert declared dead.
- **Load map**: `contend.domain.loadmap`, a CRDT. Each expert's register holds its
  summary (queues, capabilities, tier, capacity, load, the most-run task types' history, at
  most 960 bytes), stamped (run, version). Merge keeps the greater stamp, and a dead run gets
  a tombstone that only a newer publish lifts.
- **Options**: `--gossip` lists seeds (any members; the first lists itself). `--gossip-bind`
  (default `127.0.0.1:0`) sets the address. `--gossip-timing` is `lan` (default), `wan`
  or `fast`. Off loopback every packet is encrypted, with the key in `CONTEND_GOSSIP_KEY`
  (`python -m kinship keygen`; several keys separated by commas, the first one encrypting).

## Figures

Measured by `sudo python benchmarks/gossip.py` on {out["machine"]}, commit {out["commit"]}.
Members are processes, on loopback or on hosts made of network namespaces on one bridge.
This kernel has no netem, so loss is iptables' random drop on every host's input.

Detection (kill -9 on loopback; seconds from the kill to each survivor's verdict):

| timing | members | samples | suspect (median) | dead (median) | dead (worst) |
|---|---|---|---|---|---|
{rows(out["detection"], ["timing", "members", "samples", "suspect_median_s", "dead_median_s", "dead_worst_s"])}

False suspicions under packet loss (4 hosts; every suspicion here is false, since no member
fails):

| timing | loss | seconds | suspicions | per member-minute | false deaths |
|---|---|---|---|---|---|
{rows(out["false_suspicions"], ["timing", "loss", "seconds", "suspicions", "suspicions_per_member_minute", "false_deaths"])}

Convergence after a partition heals (4 hosts cut 2|2 until each side has buried the other,
with every load changed while cut; seconds from the heal until every member's map is exact):

| timing | rounds | median | worst |
|---|---|---|---|
{rows(out["heal"], ["timing", "rounds", "converged_median_s", "converged_worst_s"])}

Bandwidth (N members in one process on one namespace's loopback, each publishing a new
summary every 5 s (the default heartbeat) or every second; bytes each member sends per
second, idle and publishing):

| members | publishes/s per member | summary bytes | idle B/s | publishing B/s | bytes per update of one rival |
|---|---|---|---|---|---|
{rows(out["bandwidth"], ["members", "publish_hz_per_member", "summary_bytes", "idle_bytes_per_s_per_member", "busy_bytes_per_s_per_member", "bytes_per_update_per_member"])}

kinship caps what one member gossips. It sends to `gossip_nodes` (3) members every
`gossip_interval` (200 ms), one datagram of at most 1,400 bytes each, about 21 KB/s. The
lan preset's probes and push-pulls come on top of that. No row goes above {cap:,} B/s. Near
the cap the rumours queue up, and kinship sends only the newest summary of each member:
updates are coalesced rather than lost, and views lag. The bytes per update in a capped row
(one publish a second from 25 members up) therefore read low. At {m["heartbeat_size_bytes"]:,} B
per update, the cap carries about {cap / m["heartbeat_size_bytes"]:.0f} summaries a second
across the whole cluster: **about {5 * cap / m["heartbeat_size_bytes"]:.0f} experts at a 5 s
heartbeat**, far fewer than the link allows. Going past that means raising `gossip_nodes`,
shortening `gossip_interval` (contend does not expose either yet), or publishing less often
than every heartbeat (on a real change of load, say). This is a limit of the dissemination budget, not of the link.

Seed 002's density formula, `max_agents = floor((bandwidth − overhead) / (heartbeat_size ×
freq))`, with heartbeat_size = {m["heartbeat_size_bytes"]} B (what one rival's update costs
each member, gossip's redundancy included), freq = {m["heartbeat_hz"]} Hz (the default
heartbeat: a third of a 15 s lease) and overhead = {m["overhead_bytes_per_s"]} B/s:

| link | max experts |
|---|---|
| 1 Gbit/s, all of it | {m["1_gbit"]:,} |
| 100 Mbit/s, all of it | {m["100_mbit"]:,} |
| 1 Gbit/s, 5 % of it (the seed's "<5 %") | {m["1_gbit_at_5_percent"]:,} |

The heartbeat size grows with log N (gossip repeats each rumour about
`retransmit_mult × log N` times), so these figures flatter large clusters a little. The link
is not what limits gossip, though. A thousand experts at a 5 s heartbeat publish 200
summaries a second, over ten times the gossip budget above. Each expert would also have to
fold 200 summaries a second into its view, which costs CPU.

## What gossip does not do

Gossip never decides who owns a task: a claim is still one atomic step in the store, so a
stale or partitioned view can only make an expert wait too long or not long enough before a
race, never run a task twice. The leader of a `central` queue still reads the experts from
the store, and so does `contend status`.
"""


if __name__ == "__main__":
    sys.exit(main())
