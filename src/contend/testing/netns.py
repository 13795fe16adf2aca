"""Hosts of one LAN on one machine: network namespaces joined by veth pairs to a bridge,
with iptables for the faults a netem-less kernel can still make (random loss, partitions).

Needs root, ``ip`` (iproute2) and ``iptables`` with the ``statistic`` match. Everything is
made under a name of its own and removed by :meth:`Lan.down` (a context manager does both).
The bridge lives in a namespace of its own too: the machine's own network is not touched.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from types import TracebackType


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


class Lan:
    """*n* hosts ``ns(i)`` at ``address(i)`` on one bridge."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tag = f"cg{secrets.token_hex(3)}"  # veth names must fit 15 characters
        self.hub = f"{self.tag}-hub"
        self.subnet = f"10.{100 + os.getpid() % 100}.{secrets.randbelow(250)}"
        self._made: list[str] = []

    def ns(self, i: int) -> str:
        return f"{self.tag}-h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def up(self) -> Lan:
        try:
            _run("ip", "netns", "add", self.hub)
            self._made.append(self.hub)
            _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for i in range(self.n):
                ns = self.ns(i)
                _run("ip", "netns", "add", ns)
                self._made.append(ns)
                inner, outer = f"{self.tag}h{i}", f"{self.tag}b{i}"
                _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
                _run("ip", "link", "set", inner, "netns", ns)
                _run("ip", "link", "set", outer, "netns", self.hub)
                _run("ip", "-n", self.hub, "link", "set", outer, "master", "br0")
                _run("ip", "-n", self.hub, "link", "set", outer, "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", inner)
                _run("ip", "-n", ns, "link", "set", inner, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Remove every namespace made (their veths and rules go with them)."""
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made = []

    def __enter__(self) -> Lan:
        return self.up()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()

    def iptables(self, i: int, *rule: str) -> None:
        _run("ip", "netns", "exec", self.ns(i), "iptables", *rule)

    def loss(self, probability: float, hosts: list[int] | None = None) -> None:
        """Drop each packet a host receives with *probability* (every host by default)."""
        for i in range(self.n) if hosts is None else hosts:
            self.iptables(
                i, "-A", "INPUT", "-m", "statistic", "--mode", "random",
                "--probability", f"{probability}", "-j", "DROP",
            )  # fmt: skip

    def cut(self, side: list[int], other: list[int]) -> None:
        """A partition: nothing from *other* reaches *side*, nor the other way."""
        for a, b in [(a, b) for a in side for b in other] + [(b, a) for a in side for b in other]:
            self.iptables(a, "-A", "INPUT", "-s", self.address(b), "-j", "DROP")

    def heal(self) -> None:
        """Every loss and partition rule removed."""
        for i in range(self.n):
            self.iptables(i, "-F", "INPUT")

    def tx_bytes(self, i: int, device: str | None = None) -> int:
        """Bytes host *i* has sent on the LAN (or on *device*, ``lo`` say)."""
        dev = device or f"{self.tag}h{i}"
        out = json.loads(_run("ip", "-n", self.ns(i), "-s", "-j", "link", "show", dev))
        return int(out[0]["stats64"]["tx"]["bytes"])
