"""The CLI's long-running commands, end to end in subprocesses."""

from __future__ import annotations

from pathlib import Path

from tests.acceptance.conftest import run_cli


def test_bench_quick_runs_end_to_end(tmp_path: Path) -> None:
    """A smoke test of ``contend bench``: real expert processes, every measurement, no file."""
    done = run_cli("bench", "--quick", "--out", str(tmp_path / "b.md"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("machine speed:", "submit:", "drain:", "µs/task", "latency", "peak memory"):
        assert line in done.stdout
    assert not (tmp_path / "b.md").exists()


def test_manage_a_task_from_the_cli(tmp_path: Path) -> None:
    import json

    from tests.acceptance.conftest import APP

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    sub = run_cli("submit", APP, "echo", "--store", url, "--args", '["hi"]', "--key", "k1")
    assert sub.returncode == 0, sub.stderr
    task_id = sub.stdout.strip()
    again = run_cli("submit", APP, "echo", "--store", url, "--args", '["hi"]', "--key", "k1")
    assert again.stdout.strip() == task_id  # the idempotency key returns the same task
    cancelled = run_cli("tasks", "cancel", task_id, "--store", url, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] == "cancelled"
    twice = run_cli("tasks", "cancel", task_id, "--store", url)
    assert (
        twice.returncode == 2 and f"cannot cancel task {task_id}: it is cancelled" in twice.stderr
    )
    retried = run_cli("tasks", "retry", task_id, "--store", url)
    assert retried.stdout.strip() == f"{task_id} pending"
    shown = run_cli("tasks", "show", task_id, "--store", url)
    assert "cancelled" in shown.stdout and "retried" in shown.stdout  # the history
    # pending, and no expert runs: the store says why it is not running
    assert "not running: no_live_expert: no live expert claims from queue 'default'" in (
        shown.stdout
    )
    why = json.loads(run_cli("tasks", "show", task_id, "--store", url, "--json").stdout)
    assert why["why_not_running"]["reason"] == "no_live_expert"
    status = run_cli("status", "--store", url, "--json")
    data = json.loads(status.stdout)
    assert data["queues"]["default"]["pending"] == 1
    assert data["competition"]["success_rate"] is None
