"""A step of the host's wall clock must not move SQLite's leases (issue 12: leases must not
depend on it). SQLite's store time was each process's ``time.time()``: on one host every
process saw the same step, and every lease moved with it. Now it is the host's boot-time clock
on the wall clock's scale (store/sqlite/clock.py). These are the chaos suite's clock scenario
(python -m contend.testing.chaos --scenario clock --backend sqlite) cut down to one store call
each; both failed before."""

from __future__ import annotations

from pathlib import Path

from tests.integration.wall_clock import need_libfaketime, run_stepped

FORWARD = """
import asyncio, sys
from contend.errors import LeaseLost
from contend.store.port import ExpertInfo, Heartbeat
from contend.store.sqlite import SQLiteStore

async def main():
    store = SQLiteStore("sqlite:///" + sys.argv[1])
    await store.open()
    session = await store.register_expert(ExpertInfo("a"), 5.0)
    step(3600)  # the host's clock is stepped an hour ahead; no time passes
    try:
        await store.renew("a", session, 5.0, Heartbeat())
        print("renewed")
    except LeaseLost as exc:
        print(f"lost: {exc}")
    await store.close()

asyncio.run(main())
"""

BACKWARD = """
import asyncio, sys, time
from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import ExpertInfo
from contend.store.sqlite import SQLiteStore

async def main():
    store = SQLiteStore("sqlite:///" + sys.argv[1])
    await store.open()
    await store.submit([TaskSpec.build("t")])
    session = await store.register_expert(ExpertInfo("a"), 1.0)
    await store.claim("a", session, ["default"], Capabilities(), limit=1, lease_ttl=1.0)
    step(-3600)  # "a" dies, and the host's clock is stepped an hour back
    await asyncio.sleep(3.0)  # three leases of real time
    print(f"expired {await store.expire()}")
    await store.close()

asyncio.run(main())
"""


def test_a_step_forward_does_not_end_a_live_session(tmp_path: Path) -> None:
    need_libfaketime()
    out = run_stepped(FORWARD, tmp_path / "offset", str(tmp_path / "s.db"))
    assert out == "renewed"


def test_a_dead_owners_tasks_lapse_a_lease_later_after_a_step_back(tmp_path: Path) -> None:
    need_libfaketime()
    out = run_stepped(BACKWARD, tmp_path / "offset", str(tmp_path / "s.db"))
    assert out == "expired 1"
