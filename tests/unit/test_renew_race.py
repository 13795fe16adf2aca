"""A renewal's answer speaks only for the claims its store had seen when it was sent.

On PostgreSQL (a pool of connections) and etcd (concurrent RPCs) a claim and a renewal of the
same expert run side by side: the renewal may read the tasks the session holds before the
claim's transaction commits, and its answer may come back after the claim's. The expert must
not take that answer as "this task is no longer yours" for a task it claimed after the
renewal was sent. Found by the chaos suite's load scenario on PostgreSQL: 54 of 3,000 tasks
stopped by live experts ("no longer ours"), then run again a lease later.
"""

from __future__ import annotations

import asyncio
from typing import Any

from contend import Expert, TaskState
from contend.store.memory import MemoryStore
from contend.testing import FakeClock
from tests.unit.fakes import app_on, running


class SlowRenewals:
    """A memory store whose renewals read at once but answer only after the next claim that
    won something has answered (while ``racing`` is on)."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.racing = False
        self.raced = 0
        self._claimed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        got = await self.inner.claim(*args, **kwargs)
        if got:
            self._claimed.set()
        return got

    async def renew(self, *args: Any, **kwargs: Any) -> Any:
        held = await self.inner.renew(*args, **kwargs)  # what the store holds now
        if self.racing:
            self._claimed.clear()
            await self._claimed.wait()  # the claim's answer overtakes this one
            self.raced += 1
        return held


async def test_a_task_claimed_after_a_renewal_was_sent_is_kept() -> None:
    clock = FakeClock(0.0)
    store = SlowRenewals(MemoryStore("memory://", clock=clock))
    app = app_on(store)
    gate = asyncio.Event()

    @app.task
    async def work() -> str:
        await gate.wait()
        return "done"

    expert = Expert(app, name="e", lease_ttl=3.0, heartbeat=1.0, clock=clock)
    async with running(expert, clock):
        await clock.run(1.5)
        store.racing = True
        await clock.run(0.6)  # a renewal is now in flight, its answer held back
        handle = await app.submit(work)
        assert await clock.run_until(lambda: store.raced == 1, limit=5)
        store.racing = False
        await clock.run(0.5)
        assert expert.load == 1, "the run was stopped on a renewal older than its claim"
        gate.set()
        assert await clock.run_until(lambda: expert.stats.tasks_done == 1, limit=5)
    task = await store.get(handle.id)
    assert (task.state, task.attempts, task.fence) == (TaskState.SUCCEEDED, 1, 1)
