"""Periodic tasks on real processes and every backend: three experts schedule the same
one-second tick, one of them is killed with SIGKILL on the way, and still every tick runs
exactly once, with none missing."""

from __future__ import annotations

from datetime import UTC, datetime

from contend.domain.periodic import tick_key
from contend.domain.task import TaskState
from contend.store.port import Store
from tests.acceptance.conftest import Experts, wait_until

APP = "tests.acceptance.periodic_app:app"


async def _done(store: Store) -> dict[str, list[str]]:
    """tick -> the experts whose run of it succeeded (from each task's history)."""
    out: dict[str, list[str]] = {}
    for t in await store.list_tasks(limit=10_000):
        task = await store.get(t.id, history=True)
        if task.state == TaskState.SUCCEEDED:
            runs = [str(e.expert) for e in task.history if e.event == "succeeded"]
            out.setdefault(str(task.kwargs["tick"]), []).extend(runs)
    return out


async def test_three_experts_run_each_tick_once_through_a_kill(
    store: Store, experts: Experts
) -> None:
    for name in ("a", "b", "c"):
        experts.start(name, lease=1.0, concurrency=2, app=APP)

    async def ticks(n: int) -> dict[str, list[str]] | None:
        done = await _done(store)
        return done if len(done) >= n else None

    await wait_until(lambda: ticks(3), what="three ticks", watch=experts)
    experts.kill("a")  # whichever was scheduling: the others submit the same ticks
    before = len(await _done(store))
    await wait_until(lambda: ticks(before + 3), what="three more ticks", watch=experts)
    experts.stop_all()
    done = await _done(store)
    stamps = sorted(done)
    # one task per tick, each run once, and no tick missing between the first and the last
    assert all(len(runs) == 1 for runs in done.values()), done
    every = [t.key for t in await store.list_tasks(limit=10_000)]
    assert len(every) == len(set(every))
    first, last = stamps[0], stamps[-1]
    assert len(stamps) == _seconds_between(first, last) + 1, stamps
    for stamp in stamps:
        assert tick_key("beat", _epoch(stamp)) in every


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _seconds_between(a: str, b: str) -> int:
    return round(_epoch(b) - _epoch(a))
