"""The stores a chaos scenario runs against, each started by the suite itself: an SQLite file,
a throwaway PostgreSQL cluster (never the machine's own server), a throwaway etcd. Each can say
its URL as seen from a network namespace, and the two servers can be crashed and restarted."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from contend.testing.etcd_server import EtcdServer
from contend.testing.pg_cluster import Cluster

BACKENDS = ("sqlite", "postgres", "etcd")


def with_host(url: str, host: str) -> str:
    """*url* with its host replaced (the port and the rest kept)."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@{host}:{parts.port}" if user else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class Backend:
    """A store for one scenario. ``listen``: more addresses for the server to serve on."""

    name = ""
    networked = False  # reachable over TCP (network faults apply)

    def __init__(self, workdir: Path, listen: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.listen = listen

    @property
    def url(self) -> str:
        raise NotImplementedError

    def url_via(self, host: str) -> str:
        """The store's URL for a client that reaches the server at *host*."""
        return with_host(self.url, host)

    def start(self) -> None: ...

    def crash(self) -> None:
        """Stop the server at once, as a crash does."""
        raise NotImplementedError(f"{self.name}: no server to crash")

    def start_again(self) -> None:
        raise NotImplementedError(f"{self.name}: no server to start")

    def close(self) -> None: ...

    def log_tail(self) -> str:
        """The end of the server's own log (for a failed scenario's report)."""
        return ""

    def __enter__(self) -> Backend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SQLiteBackend(Backend):
    name = "sqlite"

    def __init__(self, workdir: Path, listen: tuple[str, ...] = (), path: Path | None = None):
        super().__init__(workdir, listen)
        self.path = path or workdir / "chaos.db"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"


class PostgresBackend(Backend):
    """A cluster of its own (initdb in a temporary directory), which may be killed at will."""

    name = "postgres"
    networked = True

    def __init__(self, workdir: Path, listen: tuple[str, ...] = ()) -> None:
        super().__init__(workdir, listen)
        self.cluster = Cluster(listen=listen)

    @property
    def url(self) -> str:
        return self.cluster.url

    def start(self) -> None:
        self.cluster.start()

    def crash(self) -> None:
        self.cluster.stop_now()  # pg_ctl -m immediate: every backend dies at once

    def start_again(self) -> None:
        self.cluster.start_again()

    def close(self) -> None:
        self.cluster.close()

    def log_tail(self) -> str:
        try:
            return (self.cluster.root / "server.log").read_text(errors="replace")[-1500:]
        except OSError:
            return ""


class EtcdBackend(Backend):
    name = "etcd"
    networked = True

    def __init__(self, workdir: Path, listen: tuple[str, ...] = ()) -> None:
        super().__init__(workdir, listen)
        self.server = EtcdServer(listen=listen)

    @property
    def url(self) -> str:
        return f"{self.server.url}/chaos"

    def start(self) -> None:
        self.server.start()

    def crash(self) -> None:
        self.server.kill()  # kill -9

    def start_again(self) -> None:
        began = time.monotonic()
        while True:  # the killed server's ports may take a moment to be free again
            try:
                self.server.start()
                return
            except RuntimeError:
                if time.monotonic() - began > 30:
                    raise

    def close(self) -> None:
        self.server.close()

    def log_tail(self) -> str:
        alive = self.server.proc is not None and self.server.proc.poll() is None
        state = "running" if alive else "not running"
        return f"etcd {state}; its log ends: {self.server.log_tail(1500)}"


def make_backend(name: str, workdir: Path, listen: tuple[str, ...] = ()) -> Backend:
    kinds: dict[str, type[Backend]] = {
        "sqlite": SQLiteBackend,
        "postgres": PostgresBackend,
        "etcd": EtcdBackend,
    }
    if name not in kinds:
        raise ValueError(f"unknown backend {name!r} (one of {', '.join(BACKENDS)})")
    return kinds[name](workdir, listen)
