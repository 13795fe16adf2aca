"""The supervisor: keep N expert processes alive on one host (seed 000 §5.1).

Each *slot* runs one expert as a child process (``contend expert … --name {base}-{slot}``) and
starts a new one when it exits. A child that dies is seen the moment it does (``waitpid``), so
the supervisor tells the store at once that its session is over (``Store.end_session``): its
tasks go back to pending in well under a second instead of after a lease TTL, and should the
child have been alive after all it is fenced out. The session to end is found by the child's
name, host and pid in the store's expert records, so a session the name has elsewhere (another
host, a process started by hand) is never touched.

Restarts back off against crash loops: a child that lived less than ``Backoff.settle`` seconds
is restarted after a delay that doubles each time (``first`` … ``most``); one that lived longer
is restarted at once. A child that exits with status 2 refused its options, which no restart
mends: the supervisor stops.

``stop()`` (SIGTERM, SIGINT) forwards SIGTERM to every child (each drains: no new claims, the
grace period for running tasks, the rest released) and restarts nothing more; asked again, it
forwards the second SIGTERM (each child stops at once) and kills those still running after
``kill_after`` seconds. Children run in a process group of their own, so a Ctrl-C in a
terminal reaches only the supervisor, which forwards it once; on Linux they are also sent
SIGTERM should the supervisor die.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from contend.errors import ContendError
from contend.store.port import Store

log = logging.getLogger("contend.supervisor")

#: A child's exit status that says its options were refused (``contend``'s "bad input").
BAD_INPUT = 2


@dataclass(frozen=True)
class Backoff:
    """Restart delays: ``first`` after a quick death, doubled each quick death after it up to
    ``most``; a child that lived ``settle`` seconds or more counts as healthy (delay 0)."""

    first: float = 0.5
    most: float = 30.0
    settle: float = 10.0

    def next(self, delay: float, lived: float) -> float:
        if lived >= self.settle:
            return 0.0
        return self.first if delay <= 0 else min(delay * 2, self.most)


@dataclass
class Death:
    """What the supervisor saw of one child's end."""

    name: str
    pid: int
    code: int  # the exit status; -N: killed by signal N
    lived: float
    tasks_returned: int | None = None  # None: no session of it was ended

    @property
    def how(self) -> str:
        if self.code < 0:
            try:
                return f"killed by {signal.Signals(-self.code).name}"
            except ValueError:
                return f"killed by signal {-self.code}"
        return f"exited with {self.code}"


@dataclass
class Slot:
    name: str
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    deaths: list[Death] = field(default_factory=list)


def _parent_death_signal() -> Callable[[], None] | None:
    """On Linux, a function for the child (run between fork and exec) that asks the kernel to
    send it SIGTERM when the supervisor dies; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def arm() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return arm


class Supervisor:
    """Keeps one expert process alive per name of *names*, started with ``command(name)``."""

    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        command: Callable[[str], list[str]],
        *,
        backoff: Backoff | None = None,
        kill_after: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.store = store
        self.slots = [Slot(n) for n in names]
        self.command = command
        self.backoff = backoff or Backoff()
        self.kill_after = kill_after
        self.env = env
        self.host = socket.gethostname()
        self.refused: Death | None = None  # a child that refused its options
        self._stops = 0
        self._stopping = asyncio.Event()
        self._arm = _parent_death_signal()

    # -- public ----------------------------------------------------------------------------
    async def run(self) -> int:
        """Run every slot until stopped; 0, or 2 when a child refused its options."""
        log.info(
            "supervisor: keeping %d expert(s) alive: %s",
            len(self.slots),
            ", ".join(s.name for s in self.slots),
        )
        await asyncio.gather(*(self._keep(slot) for slot in self.slots))
        log.info("supervisor: every expert has stopped")
        return BAD_INPUT if self.refused is not None else 0

    def stop(self) -> None:
        """First call: drain every child (SIGTERM) and restart none. Second: stop them at once
        (SIGTERM again), and kill those still running after ``kill_after`` seconds."""
        self._stops += 1
        self._stopping.set()
        self._signal_all(signal.SIGTERM)
        if self._stops == 2:
            asyncio.get_running_loop().call_later(self.kill_after, self._signal_all, signal.SIGKILL)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def pids(self) -> dict[str, int]:
        """The pid of each running child, by name."""
        return {s.name: s.proc.pid for s in self.slots if s.proc is not None}

    # -- one slot --------------------------------------------------------------------------
    async def _keep(self, slot: Slot) -> None:
        delay = 0.0
        while not self.stopping:
            if delay > 0:
                log.info("supervisor: restarting %s in %.1fs", slot.name, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                if self.stopping:
                    return
            death = await self._run_child(slot)
            if death is None:
                return
            slot.deaths.append(death)
            if death.code == BAD_INPUT and slot.starts == 1 and not self.stopping:
                log.error(
                    "supervisor: %s refused its options (exit %d); a restart would too: stopping",
                    slot.name,
                    death.code,
                )
                self.refused = death
                self.stop()
                return
            delay = self.backoff.next(delay, death.lived)

    async def _run_child(self, slot: Slot) -> Death | None:
        """Start *slot*'s child, wait for it to end and bury it; None if it could not start."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command(slot.name),
                env=self.env,
                start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only
                preexec_fn=self._arm,
            )
        except OSError as exc:
            log.error("supervisor: cannot start %s: %s", slot.name, exc)
            self.refused = Death(slot.name, 0, BAD_INPUT, 0.0)
            self.stop()
            return None
        slot.proc, slot.starts = proc, slot.starts + 1
        started = time.monotonic()
        if self.stopping:  # stopped while it was being started: it was not signalled
            self._signal(proc, signal.SIGTERM)
        code = await proc.wait()
        slot.proc = None
        death = Death(slot.name, proc.pid, code, time.monotonic() - started)
        if code != 0:  # a clean exit deregistered itself; anything else may hold tasks
            await self._bury(death)
        log.log(
            logging.INFO if self.stopping and code in (0, -signal.SIGTERM) else logging.WARNING,
            "supervisor: expert %s (pid %d) %s after %.1fs%s",
            death.name,
            death.pid,
            death.how,
            death.lived,
            ""
            if death.tasks_returned is None
            else f"; its session ended, {death.tasks_returned} task(s) back to pending",
        )
        return death

    async def _bury(self, death: Death) -> None:
        """End the session the dead child held, found by its name, host and pid."""
        try:
            for rec in await self.store.list_experts():
                if (rec.info.id, rec.info.host, rec.info.pid) == (
                    death.name,
                    self.host,
                    death.pid,
                ):
                    death.tasks_returned = await self.store.end_session(death.name, rec.session)
                    return
        except ContendError as exc:
            log.warning(
                "supervisor: could not end the session of %s (its tasks wait out their lease): %s",
                death.name,
                exc,
            )

    # -- signals ---------------------------------------------------------------------------
    def _signal_all(self, sig: signal.Signals) -> None:
        for slot in self.slots:
            if slot.proc is not None:
                self._signal(slot.proc, sig)

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
