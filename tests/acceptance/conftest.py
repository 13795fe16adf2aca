"""Run the real ``contend`` CLI in subprocesses against a real store file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contend.store.port import Store
from contend.store.registry import open_store
from contend.testing.etcd_server import EtcdServer, EtcdUnavailable, find_etcd
from contend.testing.postgres import NoServer, fresh_database

HERE = Path(__file__).parent
APP = "tests.acceptance.sample_app:app"
ROOT = HERE.parent.parent


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("CONTEND_STORE", None)
    return env


def run_cli(
    *args: str, input: str | None = None, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``contend *args``; *env* adds to the environment. An argument may hold a lone
    surrogate U+DC80-U+DCFF: it reaches the CLI as the byte that is not UTF-8."""
    return subprocess.run(
        [sys.executable, "-m", "contend", *args],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        env={**cli_env(), **(env or {})},
        cwd=ROOT,
        input=input,
        timeout=timeout,
    )


class Experts:
    """Expert subprocesses, each logging to its own file; all killed at teardown."""

    def __init__(self, url: str, logdir: Path) -> None:
        self.url = url
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()

    def start(
        self,
        name: str,
        *extra: str,
        lease: float = 1.5,
        concurrency: int = 4,
        grace: float = 5,
        app: str = APP,
    ) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contend",
                "expert",
                app,
                "--store",
                self.url,
                "--name",
                name,
                "--lease",
                str(lease),
                "--concurrency",
                str(concurrency),
                "--grace",
                str(grace),
                *extra,
            ],
            stdout=log,
            stderr=log,
            env=cli_env(),
            cwd=ROOT,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def check_alive(self) -> None:
        """Fail at once, with its log, if an expert died that was not killed on purpose."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and code not in (0, -9, -15) and name not in self.killed:
                raise AssertionError(f"expert {name} exited with {code}:\n{self.log(name)[-3000:]}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.killed.add(name)
        self.procs[name].send_signal(sig)

    def log(self, name: str) -> str:
        return (self.logdir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd for the acceptance run (see tests/integration/etcd for the rules)."""
    try:
        binary = find_etcd()
    except EtcdUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {exc}")
        pytest.skip(f"{exc} (not under CI: there this is a failure)")
    server = EtcdServer(binary)
    server.start()
    yield server
    server.close()


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """Every crash test runs on the embedded store, a real etcd and a real PostgreSQL (a fresh
    database of the server this machine runs; without one the test fails under CI=true)."""
    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd_server")
        yield f"{server.url}/acceptance-{uuid.uuid4().hex[:12]}"
    elif request.param == "postgres":
        try:
            async with fresh_database() as url:
                yield url
        except NoServer as exc:
            if os.environ.get("CI") == "true":
                raise  # under CI a missing PostgreSQL is a failure
            pytest.skip(f"not under CI and {exc}")
    else:
        yield f"sqlite:///{tmp_path / 'contend.db'}"


@pytest.fixture
def experts(db_url: str, tmp_path: Path) -> Iterator[Experts]:
    group = Experts(db_url, tmp_path)
    yield group
    group.stop_all()


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    s = await open_store(db_url)
    yield s
    await s.close()


async def wait_until(
    check: Callable[[], Awaitable[Any]],
    timeout: float = 30.0,
    what: str = "condition",
    watch: Experts | None = None,
) -> Any:
    """Poll *check* until it returns something truthy; fail after *timeout* seconds, or at
    once when an expert of *watch* died on its own."""
    deadline = time.monotonic() + timeout
    while True:
        if watch is not None:
            watch.check_alive()
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
