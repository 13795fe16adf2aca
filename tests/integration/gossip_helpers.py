"""What the gossip tests share: free ports, waiting on a condition with a deadline, and
whether this machine can build network namespaces."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

pytest.importorskip("kinship", reason="the gossip extra (kinship) is not installed")


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 now (kinship binds UDP and TCP on the same port)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = int(u.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port


async def eventually(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll *check* (a function, or one returning an awaitable) until it returns something
    true; fail saying *what* was awaited when *timeout* seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.01)


def wait_until(check: Callable[[], T], timeout: float, what: str, step: float = 0.01) -> T:
    """The same as :func:`eventually`, for code with no event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(step)


def netns_problem() -> str | None:
    """Why network namespaces cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (apt-get install iproute2 iptables)"
    name = f"contend-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        drop = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "iptables",
                "-A",
                "INPUT",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.1",
                "-j",
                "DROP",
            ],
            capture_output=True,
            text=True,
        )
        if drop.returncode != 0:
            return f"iptables' statistic match is unavailable: {drop.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def need_netns() -> None:
    """Skip when not root or on a machine without namespaces, except under CI=true, where
    either fails: the namespace tests must run there."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and not root: the network namespace tests need root")
        pytest.skip("network namespaces need root (under CI=true this fails instead)")
    problem = netns_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {problem}")
    pytest.skip(f"{problem} (not under CI: there this is a failure)")
