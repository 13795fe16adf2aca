"""Real processes for the chaos suite: ``contend expert`` and ``contend submit`` subprocesses,
each logging to a file of its own, killed, paused and resumed with real signals."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contend.testing.chaos.workload import EFFECTS_ENV

APP = "contend.testing.chaos.workload:app"


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: this one's (so that the same ``contend`` is imported),
    without a default store, plus *extra*."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[3])  # the directory holding ``contend``
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env.pop("CONTEND_STORE", None)
    env.update(extra or {})
    return env


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    group: str = ""  # which side of a fault it stands on ("far", "near", …)
    paused: bool = False
    expected_exit: bool = False  # killed or stopped on purpose

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Experts:
    """The expert processes of one scenario. Names are unique for the whole scenario: a
    replacement gets a new one (``e3`` killed, ``e3-r1`` replaces it)."""

    url: str
    workdir: Path
    effects: Path
    lease: float = 2.0
    concurrency: int = 8
    procs: dict[str, Proc] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # for every expert started from now on
    rng: random.Random = field(default_factory=lambda: random.Random(1))

    def start(
        self,
        name: str,
        *,
        url: str | None = None,
        prefix: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        group: str = "",
        concurrency: int | None = None,
    ) -> Proc:
        """Start ``contend expert`` as *name* (under *prefix*, e.g. ``ip netns exec NS``)."""
        if name in self.procs:
            raise ValueError(f"expert name {name!r} already used in this scenario")
        log = self.workdir / f"{name}.log"
        argv = [
            *prefix,
            sys.executable,
            "-m",
            "contend",
            "expert",
            APP,
            "--store",
            url or self.url,
            "--name",
            name,
            "--lease",
            f"{self.lease:g}",
            "--concurrency",
            str(concurrency or self.concurrency),
            "--grace",
            "1",
        ]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env({EFFECTS_ENV: str(self.effects), **self.env, **(env or {})}),
            )
        proc = Proc(name, popen, log, group)
        self.procs[name] = proc
        return proc

    def live(self, group: str | None = None) -> list[Proc]:
        return [
            p
            for p in self.procs.values()
            if p.alive() and not p.paused and (group is None or p.group == group)
        ]

    def pick(self, group: str | None = None) -> Proc:
        choices = self.live(group)
        if not choices:
            raise RuntimeError(f"no live expert to pick (group {group!r})")
        return self.rng.choice(choices)

    def kill(self, proc: Proc, sig: int = signal.SIGKILL) -> None:
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.expected_exit = True
        proc.popen.send_signal(sig)
        if sig == signal.SIGSTOP:
            proc.paused = True
        elif sig == signal.SIGCONT:
            proc.paused = False
        elif sig == signal.SIGKILL:
            proc.popen.wait(10)

    def replacement_name(self, old: str) -> str:
        base = old.split("-r")[0]
        n = 1
        while f"{base}-r{n}" in self.procs:
            n += 1
        return f"{base}-r{n}"

    def died(self) -> list[str]:
        """Experts that exited on their own (not killed or stopped by the scenario)."""
        return [
            f"{p.name} exited with {p.popen.returncode}: {p.text()[-2000:]}"
            for p in self.procs.values()
            if not p.alive() and not p.expected_exit
        ]

    def logs(self) -> str:
        return "\n".join(p.text() for p in self.procs.values())

    def stop_all(self, timeout: float = 15.0) -> None:
        """SIGTERM everyone (resuming the paused), then SIGKILL whoever is left."""
        for p in self.procs.values():
            if p.alive():
                p.expected_exit = True
                if p.paused:
                    p.popen.send_signal(signal.SIGCONT)
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(10)


def submitter(
    url: str, batch: Path, log: Path, *, prefix: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """``contend submit --batch`` of the workload's ``step`` tasks, in a process of its own."""
    argv = [*prefix, sys.executable, "-m", "contend", "submit", APP, "step", "--store", url]
    with log.open("ab") as out:
        return subprocess.Popen(
            [*argv, "--batch", str(batch)],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env=child_env(),
        )
