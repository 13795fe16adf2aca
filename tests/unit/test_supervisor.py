"""The supervisor's own rules: restart back-off, and giving up on refused options."""

from __future__ import annotations

import sys

from contend.runtime.supervisor import Backoff, Supervisor
from contend.store.memory import MemoryStore


def test_backoff_doubles_on_quick_deaths_and_resets_after_a_healthy_run() -> None:
    b = Backoff(first=0.5, most=4.0, settle=10.0)
    delays = [0.0]
    for _ in range(6):
        delays.append(b.next(delays[-1], lived=1.0))
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.next(4.0, lived=10.0) == 0.0


async def test_a_child_that_refuses_its_options_stops_the_supervisor() -> None:
    started: list[str] = []

    def command(name: str) -> list[str]:
        started.append(name)
        return [sys.executable, "-c", "raise SystemExit(2)"]

    sup = Supervisor(MemoryStore(), ["a-0", "a-1"], command, backoff=Backoff(first=0.01))
    assert await sup.run() == 2
    assert sup.refused is not None and sup.refused.code == 2
    assert len(started) <= 2  # each slot started at most once: no restart mends bad options


async def test_a_crashing_child_is_restarted_until_stopped() -> None:
    sup: Supervisor
    calls: list[str] = []

    def command(name: str) -> list[str]:
        calls.append(name)
        if len(calls) == 3:
            sup.stop()  # the third child is started, and told to stop
        return [sys.executable, "-c", "raise SystemExit(1)"]

    sup = Supervisor(MemoryStore(), ["c-0"], command, backoff=Backoff(first=0.01, most=0.02))
    assert await sup.run() == 0
    (slot,) = sup.slots
    assert slot.starts == 3 and [d.code for d in slot.deaths][:2] == [1, 1]
    assert slot.deaths[2].code in (1, -15)  # it exited, or the stop reached it first
