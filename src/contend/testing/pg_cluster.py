"""A throwaway PostgreSQL cluster that tests (and the chaos suite) start, restart and stop
themselves, never the machine's own server.

initdb refuses to run as root, so as root the commands run as the ``postgres`` user. The data
directory and the socket live in a temporary directory removed on close. *listen* adds
addresses to listen on besides 127.0.0.1 (a network namespace's end of a veth pair), each
trusted as 127.0.0.1 is.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path


class ClusterUnavailable(RuntimeError):
    pass


def binary(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or (
        [p] if (p := shutil.which(name)) else []
    )
    if not found:
        raise ClusterUnavailable(f"no {name} binary (install PostgreSQL's server package)")
    return found[-1]


def _peer_net(address: str) -> str:
    """The /24 around *address*: the clients on the other end of its link."""
    return ".".join(address.split(".")[:3]) + ".0/24"


class Cluster:
    """*settings*: server settings (``{"autovacuum": "off"}``) on top of initdb's defaults and
    ``fsync=off`` (tests need no durability; pass ``{"fsync": "on"}`` for a benchmark)."""

    def __init__(
        self, listen: Sequence[str] = (), settings: Mapping[str, str] | None = None
    ) -> None:
        self.listen = ["127.0.0.1", *listen]
        self.settings = {"fsync": "off", **(settings or {})}
        self.root = Path(tempfile.mkdtemp(prefix="contend-pg-"))
        self.data = self.root / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(args[:2])} failed: {done.stderr[-2000:]}")

    def _ctl(self, action: str) -> None:
        self._run(
            binary("pg_ctl"),
            action,
            "-D",
            str(self.data),
            "-w",
            "-t",
            "60",
            "-m",
            "fast",
            "-l",
            str(self.root / "server.log"),
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses={','.join(self.listen)} "
            + " ".join(f"-c {k}={v}" for k, v in self.settings.items()),
        )

    def start(self) -> None:
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
        self._run(
            binary("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"
        )
        if self.listen[1:]:
            with (self.data / "pg_hba.conf").open("a") as hba:
                for address in self.listen[1:]:
                    hba.write(f"host all all {address}/32 trust\n")
                    hba.write(f"host all all {_peer_net(address)} trust\n")
        self._ctl("start")

    def restart(self) -> None:
        self._ctl("restart")

    def stop_now(self) -> None:
        """``pg_ctl -m immediate stop``: every backend dies at once, as in a crash."""
        self._run(binary("pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate", "-w")

    def start_again(self) -> None:
        """Start the stopped server on the same port and data (it recovers from its WAL)."""
        self._ctl("start")

    def close(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(binary("pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


#: What the benchmarks run on: PostgreSQL's stock settings (autovacuum on, fsync on), so that
#: their figures say what a user's server would show. A machine's own server may be set up
#: for tests (this project's CI machine runs with autovacuum off); see docs/postgres.md.
STOCK = {"fsync": "on"}


def main(argv: list[str] | None = None) -> int:
    """``python -m contend.testing.pg_cluster [--set NAME=VALUE ...] -- CMD ARG...``: run CMD
    against a throwaway PostgreSQL server with stock settings (plus the ``--set`` ones), then
    stop it and delete its data. ``{url}`` in an argument becomes the server's URL (no
    database); CMD also finds it in ``CONTEND_TEST_PG`` and ``CONTEND_BENCH_PG_SERVER``, and
    ``CONTEND_BENCH_PG`` names its ``postgres`` database. The benchmarks use it."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    settings = dict(STOCK)
    while args[:1] == ["--set"] and len(args) >= 2 and "=" in args[1]:
        name, _, value = args[1].partition("=")
        settings[name] = value
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0].startswith("-"):
        print("usage: python -m contend.testing.pg_cluster [--set NAME=VALUE ...] -- CMD ARG...")
        return 2
    cluster = Cluster(settings=settings)
    try:
        cluster.start()
        server = cluster.url.rsplit("/", 1)[0]
        shown = ", ".join(f"{k}={v}" for k, v in settings.items())
        print(f"PostgreSQL at {server} (throwaway; stock settings and {shown})", flush=True)
        env = {
            **os.environ,
            "CONTEND_TEST_PG": server,
            "CONTEND_BENCH_PG_SERVER": server,
            "CONTEND_BENCH_PG": cluster.url,
        }
        return subprocess.call([a.replace("{url}", server) for a in args], env=env)
    finally:
        cluster.close()


if __name__ == "__main__":
    raise SystemExit(main())
