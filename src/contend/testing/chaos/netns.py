"""A network namespace joined to this one by a veth pair, and faults on the link between them.

Processes started with :attr:`Link.prefix` (``ip netns exec NAME``) live in the namespace: they
reach this namespace's servers only at :attr:`Link.server_host`, through the pair, and the
faults are nftables rules inside the namespace, so nothing of this namespace's own network is
touched:

* :meth:`Link.hang` — every packet on the link is dropped, both ways, nothing is reset: a
  partition whose packets vanish (TCP retransmits until it heals, then delivers what was held);
* :meth:`Link.cut` — connections on the link are reset (``ss -K``) and new ones refused with a
  reset: the far side sees errors at once;
* :meth:`Link.lossy` — a share of the packets is dropped at random, both ways;
* :meth:`Link.heal` — no rule any more.

The addresses are in 198.18.0.0/15, the range set aside for benchmarking links in a lab
(RFC 2544): they exist only on the two ends of the pair, inside this machine. (The kernel of the
machines this suite runs on has no ``netem`` queueing discipline, so there is no delay fault.)
Needs root, ``ip`` (iproute2) and ``nft`` (nftables): :func:`available` says whether they are.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


class NetnsUnavailable(RuntimeError):
    pass


def available() -> str | None:
    """None when links can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft", "ss") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (run scripts/install-chaos.sh)"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(argv)}: {done.stderr.strip()[-500:]}")
    return done


class Link:
    """One namespace and its veth pair; ``with Link(n) as link:`` makes and removes them."""

    def __init__(self, index: int = 0) -> None:
        tag = f"{os.getpid() % 100000}{index}"
        self.name = f"contend-chaos-{tag}"
        self.here_if, self.far_if = f"cch{tag}"[:15], f"ccf{tag}"[:15]
        octet = (os.getpid() + index) % 200 + 20
        self.server_host = f"198.18.{octet}.1"  # this side: servers listen here too
        self.far_host = f"198.18.{octet}.2"
        self.made = False

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def create(self) -> Link:
        why = available()
        if why:
            raise NetnsUnavailable(why)
        self.close()  # what a killed earlier run may have left
        _run("ip", "netns", "add", self.name)
        self.made = True
        _run("ip", "link", "add", self.here_if, "type", "veth", "peer", "name", self.far_if)
        _run("ip", "link", "set", self.far_if, "netns", self.name)
        _run("ip", "addr", "add", f"{self.server_host}/24", "dev", self.here_if)
        _run("ip", "link", "set", self.here_if, "up")
        self._in("ip", "addr", "add", f"{self.far_host}/24", "dev", self.far_if)
        self._in("ip", "link", "set", self.far_if, "up")
        self._in("ip", "link", "set", "lo", "up")
        return self

    def _in(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(*self.prefix, *argv, check=check)

    def _rules(self, out: Sequence[str], into: Sequence[str]) -> None:
        self.heal()
        lines = [
            "table inet contend_chaos {",
            "  chain out { type filter hook output priority 0; policy accept;",
            *(f"    {rule}" for rule in out),
            "  }",
            "  chain in { type filter hook input priority 0; policy accept;",
            *(f"    {rule}" for rule in into),
            "  }",
            "}",
        ]
        done = subprocess.run(
            [*self.prefix, "nft", "-f", "-"],
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise NetnsUnavailable(f"nft: {done.stderr.strip()[-500:]}")

    # -- faults ----------------------------------------------------------------------------
    def hang(self) -> None:
        """Drop every packet on the link, both ways, resetting nothing."""
        self._rules([f'oifname "{self.far_if}" drop'], [f'iifname "{self.far_if}" drop'])

    def cut(self) -> None:
        """Reset every connection on the link and refuse new ones with a reset."""
        self._rules(
            [
                f'oifname "{self.far_if}" meta l4proto tcp reject with tcp reset',
                f'oifname "{self.far_if}" drop',
            ],
            [f'iifname "{self.far_if}" drop'],
        )
        self._in("ss", "-K", "dst", self.server_host, check=False)

    def lossy(self, percent: int) -> None:
        """Drop *percent* % of the packets on the link, at random, both ways."""
        rule = f"numgen random mod 100 < {int(percent)} drop"
        self._rules([f'oifname "{self.far_if}" {rule}'], [f'iifname "{self.far_if}" {rule}'])

    def heal(self) -> None:
        self._in("nft", "delete", "table", "inet", "contend_chaos", check=False)

    # -- life ------------------------------------------------------------------------------
    def close(self) -> None:
        _run("ip", "link", "del", self.here_if, check=False)
        _run("ip", "netns", "del", self.name, check=False)
        self.made = False

    def __enter__(self) -> Link:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()
