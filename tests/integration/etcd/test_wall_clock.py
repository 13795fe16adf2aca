"""etcd's leases are etcd's, so a step of an expert's wall clock leaves them alone; but etcd has
no clock, and a task's due time is the client's ``time.time()`` (docs/etcd.md). A task given
back when its owner's lease lapsed keeps the due time its submitter's clock gave it, so an
expert whose clock was stepped back did not see it as due until its clock caught up: a dead
expert's tasks waited an hour after a one-hour step (the chaos suite's clock scenario on etcd).
Now a task given back is due at once by the clock of whoever gives it back (the domain's
``expired`` outcome: ``run_at = min(run_at, now)``)."""

from __future__ import annotations

from pathlib import Path

from contend.domain.task import Capabilities, TaskSpec
from contend.store.etcd import EtcdStore
from contend.store.port import ExpertInfo
from contend.testing.etcd_server import EtcdServer
from tests.integration.wall_clock import need_libfaketime, run_stepped

BEHIND = """
import asyncio, sys, time
from contend.domain.task import Capabilities
from contend.store.etcd import EtcdStore
from contend.store.port import ExpertInfo, Heartbeat

async def main():
    step(-3600)  # this expert's host clock was stepped an hour back
    store = EtcdStore(sys.argv[1])
    await store.open()
    session = await store.register_expert(ExpertInfo("b"), 2.0)
    began = time.monotonic()
    while time.monotonic() - began < 10:
        await store.renew("b", session, 2.0, Heartbeat())
        await store.expire()
        got = await store.claim("b", session, ["default"], Capabilities(), limit=1, lease_ttl=2.0)
        if got:
            print("claimed"); break
        await asyncio.sleep(0.2)
    else:
        print("never claimed")
    await store.close()

asyncio.run(main())
"""


async def test_a_dead_owners_task_is_due_for_an_expert_whose_clock_was_stepped_back(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    need_libfaketime()
    url = f"{etcd_server.url}/clock-{tmp_path.name}"
    store = EtcdStore(url, timeout=3.0)
    await store.open()
    try:
        await store.submit([TaskSpec.build("t")])
        session = await store.register_expert(ExpertInfo("a"), 2.0)
        got = await store.claim("a", session, ["default"], Capabilities(), limit=1, lease_ttl=2)
        assert len(got) == 1  # "a" never renews: it is dead
        out = run_stepped(BEHIND, tmp_path / "offset", url)
        assert out == "claimed"
    finally:
        await store.close()
