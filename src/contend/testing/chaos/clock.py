"""A jump of the experts' host wall clock, forward and back, in the middle of a run: leases
must not depend on it.

Every expert process runs under libfaketime (Debian's ``libfaketime``, ``LD_PRELOAD``) with
``FAKETIME_DONT_FAKE_MONOTONIC=1``: its wall clock (``time()``, ``gettimeofday``,
``clock_gettime(CLOCK_REALTIME)``, and so SQLite's ``'now'``) reads the real time plus an offset
the scenario writes into a file that libfaketime reads at every call, while its monotonic
clock is left alone. That is what a step of a host's clock (``date -s``, an NTP step, a VM
restored from a snapshot) does to a process: the wall clock jumps, ``CLOCK_MONOTONIC`` does
not. The experts share the offset file, as processes on one host share its clock; the servers
(PostgreSQL, etcd) run on the true time, as other hosts would. A time namespace
(``unshare --time``) would be the wrong tool: it offsets the monotonic and boot clocks and
leaves the wall clock as it is. The runtime's injectable Clock would not reach the drivers,
SQLite or the store's own use of ``time.time``.

A kill -9 after each jump checks that a dead expert's tasks are still taken over about one
lease later, neither at once (a jump forward that makes every lease look lapsed) nor an hour
later (a jump back that makes every lease look an hour longer).
"""

from __future__ import annotations

import glob
import os
import signal
import time
from pathlib import Path

from contend.testing.chaos.effects import Effects
from contend.testing.chaos.scenario import Fault, Run


def libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def missing() -> str | None:
    return None if libfaketime() else "no libfaketime (run scripts/install-chaos.sh)"


def faked_env(offset_file: Path) -> dict[str, str]:
    """The environment of a process whose wall clock runs *offset_file*'s seconds off (read
    at every call), its monotonic clock untouched."""
    lib = libfaketime()
    if lib is None:
        raise RuntimeError(missing())
    if not offset_file.exists():
        set_offset(offset_file, 0)
    return {
        "LD_PRELOAD": lib,
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_NO_CACHE": "1",  # read the file at every call: the jump is seen at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def _offset(path: Path) -> int:
    return int(path.read_text())


def set_offset(path: Path, seconds: int) -> None:
    """Step the wall clock of the processes reading *path* to *seconds* off the true time."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{seconds:+d}\n")
    os.replace(tmp, path)  # libfaketime never reads half a file


async def jump(run: Run) -> None:
    offset = run.workdir / "clock-offset"
    run.experts.env = faked_env(offset)
    size = run.size
    specs = []
    for n in range(size.tasks):
        specs += run.specs(1, steps=20, step_time=0.05, every=4 if n % 2 else 40)
    await run.submit_specs(specs)
    for i in range(size.experts):
        run.experts.start(f"e{i}")
    await run.experts_up()
    await run.until_succeeded(1, 60, "the first task to succeed")

    # A step forward: no lease may look lapsed because of it.
    losses = run.experts.logs().count("lost its lease")
    run.fault("wall clock +1 h", None, interrupts=False)
    set_offset(offset, 3600)
    await run.sleep(run.lease * 2)
    lost = run.experts.logs().count("lost its lease") - losses
    if lost:
        run.problems.append(
            f"{lost} expert(s) lost their lease when the wall clock jumped 1 h forward: "
            "leases followed the wall clock"
        )
    await _kill_and_watch(run, "kill -9 an hour ahead", offset, None)
    # An expert dies just before a step back: its tasks must not wait for the clock to catch up.
    await _kill_and_watch(run, "kill -9, then the clock 2 h back", offset, -3600)
    # Forward to the hour the dead expert's leases were written in (what it waits for), then
    # back to the true time with every expert alive.
    set_offset(offset, 3600)
    run.fault("wall clock +1 h again", None, interrupts=False)
    await run.sleep(run.lease * 2)
    set_offset(offset, 0)
    run.fault("wall clock back to true", None, interrupts=False)
    await run.until_all_done(size.pick(120, 600))


async def _kill_and_watch(run: Run, kind: str, offset: Path, then: int | None) -> None:
    """Kill an expert busy with tasks, set the clock *then* seconds off at once (if given),
    and check that its tasks are taken over within three leases (a lease and a little is what
    a fault-free run takes)."""
    await _busy(run)
    victim = next(p for p in run.experts.live() if _running(run, p.name))
    fault = run.fault(kind, (victim.name,))
    run.experts.kill(victim, signal.SIGKILL)
    if then is not None:
        set_offset(offset, then)
    run.experts.start(run.experts.replacement_name(victim.name))
    bound = run.lease * 3

    async def taken_over() -> bool:
        effects = Effects.read(run.effects)
        runs = effects.interrupted(fault.at, (victim.name,))
        return all(effects.recovery(r, fault.at, takeover=True) is not None for r in runs)

    try:
        await run.until(taken_over, bound, f"the tasks of {victim.name} to be taken over")
    except AssertionError:
        run.problems.append(
            f"{kind}: the dead expert's tasks were not taken over within {bound:.0f}s: "
            + await _why_waiting(run, fault, _offset(offset))
        )


async def _why_waiting(run: Run, fault: Fault, offset: int) -> str:
    """Why the dead expert's tasks wait: still held (its lease follows the wall clock), or
    given back but not due on the experts' clock (due times follow it)."""
    effects = Effects.read(run.effects)
    store = await run.open()
    states = []
    for r in effects.interrupted(fault.at, fault.experts):
        task = await store.get(r.task)
        if task.owner == r.expert:
            states.append("still held by the dead expert: leases follow the wall clock")
        elif str(task.state) == "pending":
            ahead = task.run_at - (time.time() + offset)
            states.append(
                f"given back, but due only {ahead:.0f}s from now on the experts' clock: "
                "due times follow the wall clock"
            )
        else:
            states.append(f"{task.state}, owner {task.owner}")
    return "; ".join(sorted(set(states))) or "no task in flight"


def _running(run: Run, name: str) -> bool:
    return bool(Effects.read(run.effects).running_at(time.monotonic(), (name,)))


async def _busy(run: Run) -> None:
    async def busy() -> bool:
        return any(_running(run, p.name) for p in run.experts.live())

    await run.until(busy, 60, "an expert to be running a task", every=0.2)
