"""Rate limits on real processes and every backend: four expert processes race for the tasks
of two rate-limited tenants, and no tenant ever starts faster than its rate, while the two
tenants' limits stay independent of each other."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from contend.domain.task import TaskState
from contend.store.port import Store
from tests.acceptance.conftest import Experts, run_cli, wait_until
from tests.acceptance.limits_app import app, call_api, hold, report

APP = "tests.acceptance.limits_app:app"
INTERVAL = 1 / 20  # call_api's rate: 20 a second per tenant, burst 1


async def _claim_times(store: Store, ids: list[str]) -> list[float]:
    """When each task was first claimed (its history, on the store's clock), in order; those
    not claimed yet are left out."""
    out = []
    for tid in ids:
        task = await store.get(tid, history=True)
        claims = [e.at for e in task.history if e.event in ("claimed", "started")]
        out += claims[:1] and [min(claims)]
    return sorted(out)


async def test_four_experts_never_start_a_tenant_faster_than_its_rate(
    store: Store, experts: Experts
) -> None:
    tenants = {
        t: [s.id for s in await store.submit([app.build_spec(call_api, [t, n]) for n in range(30)])]
        for t in ("a", "b")
    }
    for name in ("e1", "e2", "e3", "e4"):
        experts.start(name, lease=2.0, concurrency=4, app=APP)

    async def all_done() -> bool:
        states = [t.state for t in await store.list_tasks(limit=1000)]
        return states.count(TaskState.SUCCEEDED) == 60

    await wait_until(all_done, timeout=60, what="60 rate-limited tasks", watch=experts)
    experts.stop_all()
    times = {t: await _claim_times(store, ids) for t, ids in tenants.items()}
    for tenant, ts in times.items():
        gaps = [b - a for a, b in pairwise(ts)]
        # the rate, held across four processes: never two starts closer than the interval
        assert min(gaps) >= INTERVAL * (1 - 1e-6), (tenant, min(gaps))
        # and it is used: the 30 starts span about 29 intervals, not many times that
        assert ts[-1] - ts[0] < 29 * INTERVAL * 4, (tenant, ts[-1] - ts[0])
    # the tenants' limits are their own: their runs overlap in time
    assert times["b"][0] < times["a"][-1] and times["a"][0] < times["b"][-1]


async def test_a_tenants_burst_does_not_hold_back_another_tenant(
    store: Store, experts: Experts
) -> None:
    for name in ("e1", "e2", "e3", "e4"):
        experts.start(name, lease=2.0, concurrency=4, app=APP)
    burst = [app.build_spec(report, ["a", n]) for n in range(3000)]
    await store.submit(burst)

    async def started(n: int) -> bool:
        done = await store.list_tasks(state=TaskState.SUCCEEDED, limit=n)
        return len(done) >= n

    await wait_until(lambda: started(30), what="a's burst under way", watch=experts)
    b = [s.id for s in await store.submit([app.build_spec(report, ["b", n]) for n in range(20)])]
    # b competes from when its tasks are visible: a's claims while the submit was on its way
    # (tens on a loaded PostgreSQL) owe nothing to fair share
    b_at = await store.now()

    async def b_done() -> bool:
        states = [(await store.get(t)).state for t in b]
        return all(s == TaskState.SUCCEEDED for s in states)

    await wait_until(b_done, timeout=60, what="b's 20 tasks", watch=experts)
    b_last = max(await _claim_times(store, b))
    a_times = await _claim_times(store, [s.id for s in burst])
    a_meanwhile = sum(1 for t in a_times if b_at <= t <= b_last)
    # b has half the slots while it has work: about as many of a's ran meanwhile as b's
    # (20), plus the slots already taken when b came; without fair share, all of a's rest
    assert a_meanwhile <= 20 + 2 * 16, (a_meanwhile, sum(1 for t in a_times if t > b_at))
    # and a's burst was still going on: many of it were left when b was done
    assert len(burst) - sum(1 for t in a_times if t <= b_last) > 500


async def test_tasks_show_says_a_task_waits_for_its_keys_room(
    store: Store, experts: Experts, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    first, second = (
        s.id
        for s in await store.submit([app.build_spec(hold, ["front", str(release)]) for _ in "ab"])
    )
    experts.start("e1", concurrency=4, app=APP)

    async def one_running() -> list[str]:
        running = await store.list_tasks(state=TaskState.RUNNING)
        return [t.id for t in running]

    (busy,) = await wait_until(one_running, what="one task of the door running", watch=experts)
    waiting = second if busy == first else first
    shown = run_cli("tasks", "show", waiting, "--json", "--store", experts.url)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert (data["limit_key"], data["concurrency_limit"]) == ("door:front", 1)
    assert data["why_not_running"]["reason"] == "held_by_concurrency_limit"
    text = run_cli("tasks", "show", waiting, "--store", experts.url)
    assert "limit key: door:front (at most 1 at once)" in text.stdout
    assert "held_by_concurrency_limit: its limit key 'door:front' has 1 task(s)" in text.stdout
    release.touch()

    async def both_done() -> bool:
        states = [t.state for t in await store.list_tasks()]
        return states == [TaskState.SUCCEEDED] * 2

    await wait_until(both_done, what="both tasks done", watch=experts)
