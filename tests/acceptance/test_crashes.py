"""Invariants on real processes: kill -9, SIGSTOP past the lease, graceful SIGTERM."""

from __future__ import annotations

import signal
import time

from contend.domain.task import TaskSpec, TaskState
from contend.store.port import Store
from tests.acceptance.conftest import Experts, wait_until


def stepper(steps: int, step_time: float) -> TaskSpec:
    return TaskSpec.build("stepper", [steps, step_time], max_attempts=6)


async def succeeded_once(store: Store, task_id: str) -> bool:
    task = await store.get(task_id, history=True)
    return (
        task.state == TaskState.SUCCEEDED
        and [e.event for e in task.history].count("succeeded") == 1
    )


async def test_kill_9_loses_nothing_commits_once_and_resumes(
    store: Store, experts: Experts
) -> None:
    specs = [stepper(25, 0.04) for _ in range(12)]
    await store.submit(specs)
    victim = experts.start("victim", lease=1.0, concurrency=6)

    async def victim_has_progress() -> list[str]:
        running = await store.list_tasks(state=TaskState.RUNNING)
        return [
            t.id
            for t in running
            if t.owner == "victim" and (t.checkpoint or {}).get("done", 0) >= 3
        ]

    held = await wait_until(victim_has_progress, what="the victim to checkpoint", watch=experts)
    experts.kill("victim")
    victim.wait(timeout=10)
    killed_at = time.monotonic()
    experts.start("survivor", lease=1.0, concurrency=6)

    async def all_done() -> bool:
        tasks = await store.list_tasks(limit=1000)
        return all(t.state == TaskState.SUCCEEDED for t in tasks)

    await wait_until(all_done, timeout=60, what="every task to succeed", watch=experts)
    assert time.monotonic() - killed_at < 30
    for spec in specs:
        assert await succeeded_once(store, spec.id), spec.id
    for task_id in held:
        task = await store.get(task_id)
        assert task.result["resumed_from"] >= 3, task.result  # started from the checkpoint
        assert task.result["by"] == "survivor"
        assert task.fence >= 2
        assert task.attempts >= 2


async def test_paused_expert_is_fenced_out_and_stops(store: Store, experts: Experts) -> None:
    (spec,) = [TaskSpec.build("slow", [2.5], max_attempts=5)]
    await store.submit([spec])
    paused = experts.start("paused", lease=1.0, concurrency=1)

    async def running_on_paused() -> bool:
        task = await store.get(spec.id)
        return task.state == TaskState.RUNNING and task.owner == "paused"

    await wait_until(running_on_paused, what="the task to run on the paused expert", watch=experts)
    paused.send_signal(signal.SIGSTOP)
    try:
        experts.start("rescuer", lease=1.0, concurrency=1)

        async def done_by_rescuer() -> bool:
            task = await store.get(spec.id)
            return task.state == TaskState.SUCCEEDED

        await wait_until(done_by_rescuer, timeout=30, what="the rescuer to finish the task")
    finally:
        paused.send_signal(signal.SIGCONT)
    resumed_at = time.monotonic()

    async def noticed() -> bool:
        return "lost its lease" in experts.log("paused")

    await wait_until(noticed, timeout=10, what="the paused expert to notice it lost the task")
    # lease 1s, heartbeat every 1/3 s: it must notice within about one heartbeat
    assert time.monotonic() - resumed_at < 2.0
    text = experts.log("paused")
    # its one task was either still running or finished but not yet committed: never committed.
    # Or the pause caught the claim's answer on its way: the store had the task running on it
    # (what the test waited for), the expert had not started it, and the claim is given up.
    assert (
        "stopping 1 running task(s) and dropping 0" in text
        or "stopping 0 running task(s) and dropping 1" in text
        or "(no answer to a claim before the lease ran out): stopping 0 running task(s) and "
        "dropping 0"
        in text
    ), text
    task = await store.get(spec.id, history=True)
    assert task.state == TaskState.SUCCEEDED
    assert task.result == {"by": "rescuer", "fence": 2}
    assert [e.event for e in task.history].count("succeeded") == 1
    assert [e.expert for e in task.history if e.event == "succeeded"] == ["rescuer"]
    assert paused.poll() is None  # it carries on working after losing the lease


async def test_sigterm_releases_unfinished_work_at_once(store: Store, experts: Experts) -> None:
    specs = [TaskSpec.build("slow", [30.0]) for _ in range(2)]
    await store.submit(specs)
    proc = experts.start("leaver", lease=30.0, concurrency=2, grace=0.5)

    async def both_running() -> bool:
        return len(await store.list_tasks(state=TaskState.RUNNING)) == 2

    await wait_until(both_running, what="both tasks to start", watch=experts)
    # a short grace: the tasks cannot finish, so they must be released (not left to lapse)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    for spec in specs:
        task = await store.get(spec.id)
        assert task.state == TaskState.PENDING
        assert task.owner is None
        assert task.attempts == 0  # a release gives the attempt back
    assert "released 2 unfinished task(s)" in experts.log("leaver")
