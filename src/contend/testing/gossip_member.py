"""One gossip member in a process of its own, for fault tests and the gossip benchmark.

``python -m contend.testing.gossip_member --name a --bind 127.0.0.1:7946 --seeds …`` joins,
publishes a summary with ``--load``, and prints one JSON line per happening on stdout, with
the wall time ``t``:

* ``{"ev": "ready", "addr": …}`` once it has joined;
* ``{"ev": "joined"|"suspect"|"recovered"|"dead"|"left", "who": member}`` per membership event;
* ``{"ev": "view", "loads": {expert: load}}`` whenever the load map's live view changes.

Lines on stdin steer it: ``load N`` publishes a new load, ``stats`` prints kinship's
counters as ``{"ev": "stats", …}``, and ``leave`` (or the end of stdin) leaves and exits.
Off loopback it reads the cluster's key from ``CONTEND_GOSSIP_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from contend.gossip import GossipNode, summary
from contend.store.port import ExpertInfo


def _say(**fields: Any) -> None:
    print(json.dumps({"t": time.time(), **fields}), flush=True)


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m contend.testing.gossip_member")
    p.add_argument("--name", required=True)
    p.add_argument("--bind", default="127.0.0.1:0")
    p.add_argument("--seeds", default="")
    p.add_argument("--timing", default="fast")
    p.add_argument("--load", type=int, default=0)
    p.add_argument("--capacity", type=int, default=8)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    keys = [k for k in os.environ.get("CONTEND_GOSSIP_KEY", "").split(",") if k]
    node = GossipNode(
        args.name,
        bind=args.bind,
        seeds=[s for s in args.seeds.split(",") if s],
        keys=keys,
        timing=args.timing,
        min_gap=0.05,
    )
    info = ExpertInfo(id=args.name, queues=("default",), capacity=args.capacity)
    shown: dict[str, int] = {}

    def view() -> None:
        nonlocal shown
        loads = {r.info.id: r.load for r in node.records() or ()}
        if loads != shown:
            shown = loads
            _say(ev="view", loads=loads)

    def on_event(kind: str, who: str) -> None:
        if kind not in ("updated", "published"):
            _say(ev=kind, who=who)
        view()

    node.on_event = on_event
    node.publish(summary(info, args.load, {}))
    await node.start()
    _say(ev="ready", addr=node.address)
    view()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := (await reader.readline()).decode().strip():
            word, _, rest = line.partition(" ")
            if word == "load":
                node.publish(summary(info, int(rest), {}))
            elif word == "stats":
                _say(ev="stats", **node.stats(), published=node.published)
            elif word == "leave":
                break
    finally:
        await node.close()
    return 0


class MemberProcess:
    """A gossip member run as ``python -m contend.testing.gossip_member`` (optionally inside
    a network namespace), with what it printed collected by a thread."""

    def __init__(
        self,
        name: str,
        *,
        bind: str = "127.0.0.1:0",
        seeds: Sequence[str] = (),
        timing: str = "fast",
        load: int = 0,
        netns: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        cmd = [sys.executable, "-m", "contend.testing.gossip_member", "--name", name]
        cmd += ["--bind", bind, "--seeds", ",".join(seeds), "--timing", timing]
        cmd += ["--load", str(load)]
        if netns is not None:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"member-{name}")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.lines.append(item)

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.lines)

    def events(self, kind: str, who: str | None = None, after: float = 0.0) -> list[float]:
        """The times of the *kind* events (about *who*) printed after *after*."""
        return [
            e["t"]
            for e in self.seen()
            if e.get("ev") == kind and (who is None or e.get("who") == who) and e["t"] >= after
        ]

    def view(self) -> dict[str, int] | None:
        """The last live view it printed: expert -> load."""
        views = [e["loads"] for e in self.seen() if e.get("ev") == "view"]
        return views[-1] if views else None

    @property
    def address(self) -> str | None:
        ready = [e for e in self.seen() if e.get("ev") == "ready"]
        return str(ready[0]["addr"]) if ready else None

    def send(self, line: str) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(line + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def signal(self, signum: int) -> float:
        """Send *signum*; returns the wall time it was sent."""
        t = time.time()
        os.kill(self.proc.pid, signum)
        return t

    def stop(self) -> None:
        """Leave and exit (a stopped process is woken first); kill after 5 s. Closes the
        pipes."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.send("leave")
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
