"""An expert outrun by its rivals claims again at once.

A store whose claims are optimistic (etcd) comes back short when rivals took some of the
tasks it tried, while more of the backlog is still pending. The loop took such a claim for
one that had taken everything there was, and waited for a change of work for up to
``idle_wait``: none came (a burst's backlog was all in), and four experts draining 20,000
tasks on etcd split them 0.14 / 0.95 / 1.2 / 1.7 of an even share. A store says so with
``Outrun``: the loop looks again at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contend import Expert
from contend.store.memory import MemoryStore
from contend.store.port import Claimed, Outrun
from contend.testing import FakeClock
from tests.unit.fakes import app_on, running


class Outrunning(MemoryStore):
    """A memory store whose claims of whatever is best take one task, reporting (when
    *outrun*) that rivals took the others it tried, as an etcd claim that lost a race does."""

    def __init__(self, clock: FakeClock, *, outrun: bool) -> None:
        super().__init__("memory://", clock=clock)
        self.outrun = outrun

    async def claim(
        self,
        expert: str,
        session: str,
        queues: Sequence[str],
        capabilities: Any,
        *,
        limit: int,
        task_ids: Sequence[str] | None = None,
        **kw: Any,
    ) -> list[Claimed]:
        if task_ids is not None:
            return await super().claim(
                expert, session, queues, capabilities, limit=limit, task_ids=task_ids, **kw
            )
        got = await super().claim(expert, session, queues, capabilities, limit=1, **kw)
        return Outrun(got) if self.outrun and got and limit > 1 else got


async def starts(*, outrun: bool) -> tuple[list[float], float]:
    """When each of three tasks, all pending before the expert starts, began to run; the
    expert's idle wait."""
    clock = FakeClock(1_000.0)
    store = Outrunning(clock, outrun=outrun)
    app = app_on(store)
    started: list[float] = []

    @app.task
    async def note(n: int) -> None:
        started.append(clock())

    for n in range(3):
        await app.submit(note, [n])
    expert = Expert(app, name="x", concurrency=4, prefetch=0, lease_ttl=30.0, clock=clock)
    async with running(expert, clock):
        assert await clock.run_until(lambda: len(started) == 3, limit=10)
    return started, expert.config.idle_wait


async def test_an_outrun_claim_is_followed_by_another_at_once() -> None:
    started, _ = await starts(outrun=True)
    assert started[-1] - started[0] < 0.1, started


async def test_a_short_claim_without_rivals_waits_for_a_change() -> None:
    """The same claims, not outrun: each looks like the last of the backlog, and the expert
    waits for a change before the next (this is what the test above guards against)."""
    started, idle_wait = await starts(outrun=False)
    assert started[-1] - started[0] >= idle_wait, started
