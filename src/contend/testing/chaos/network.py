"""Network faults between some experts and the store while the others keep their path: the
"far" experts run in a network namespace (:mod:`contend.testing.chaos.netns`) and reach the
server through a veth pair; the "near" ones use the loopback.

* a **hang** longer than the lease: every packet on the link vanishes, nothing is reset, so the
  far experts' calls simply get no answer; they must stop their tasks within lease + one
  heartbeat of the hang, while the near ones take the tasks over and keep committing;
* a **cut**: the far experts' connections are reset and new ones refused;
* (full mode) a **lossy** link: 30 % of the packets dropped at random for a while.
"""

from __future__ import annotations

import time

from contend.testing.chaos.effects import Effects
from contend.testing.chaos.scenario import Run


async def partition(run: Run) -> None:
    link = run.link
    assert link is not None, "the network scenario needs its namespace"
    size = run.size
    # half checkpoint (and so wait on the store) often, half never: those are stopped by the
    # watchdog alone
    # (tasks are claimed in the order they were made: make the two kinds in turn)
    specs = []
    for n in range(size.tasks):
        every = 4 if n % 2 else 40
        specs += run.specs(1, steps=20 if n % 2 else 40, step_time=0.05, every=every)
    await run.submit_specs(specs)
    far_url = run.backend.url_via(link.server_host)
    far = max(1, size.experts // 2)
    for i in range(far):
        run.experts.start(f"far{i}", url=far_url, prefix=link.prefix, group="far")
    for i in range(size.experts - far):
        run.experts.start(f"near{i}", group="near")
    await run.experts_up()
    kinds = ["hang", "cut"] * size.rounds
    for n, kind in enumerate(kinds[: max(1, size.rounds)]):
        await _far_busy(run)
        names = tuple(p.name for p in run.experts.live("far"))
        before = await run.retrying(run.succeeded, 30, "a count")
        fault = run.fault(f"network {kind}", names)
        if kind == "hang":
            link.hang()
        else:
            link.cut()
        hold = run.lease * (2.5 if kind == "hang" else 1.5)
        await run.sleep(hold)
        during = await run.retrying(run.succeeded, 30, "a count") - before
        link.heal()
        run.heal(fault)
        if during <= 0:
            run.problems.append(f"nothing was committed during the {kind}: the near experts too?")
        if kind == "hang":
            run.check_stopped_in_time(fault)
        run.notes.append(f"{during} task(s) committed by the near experts during {kind} {n + 1}")
    if not size.short:
        fault = run.fault("lossy link (30 % dropped)", None, interrupts=False)
        link.lossy(30)
        await run.sleep(run.lease * 4)
        link.heal()
        run.heal(fault)
    await run.until_all_done(size.pick(180, 600))


async def _far_busy(run: Run) -> None:
    """Until a far expert is in the middle of a task (so that the fault lands on work)."""

    async def busy() -> bool:
        names = [p.name for p in run.experts.live("far")]
        return bool(Effects.read(run.effects).running_at(time.monotonic(), names))

    await run.until(busy, 60, "a far expert to be running a task", every=0.2)
