"""Dependencies that carry results, on a real SQLite file: a diamond graph and a fan-in, the
results reaching the children through a ``parents`` parameter and ``ctx.parents()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contend import After, App, TaskContext, TaskFailed, TaskState
from contend.errors import TaskError
from tests.integration.test_runtime import expert

ROOT = Path(__file__).parents[2]


async def test_a_diamond_passes_results_down(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'diamond.db'}")

    @app.task
    async def source(n: int) -> int:
        return n

    @app.task
    async def double(parents: list[int]) -> int:
        (n,) = parents
        return 2 * n

    @app.task
    def square(parents: list[int]) -> int:  # a sync function gets them the same way
        (n,) = parents
        return n * n

    @app.task
    async def join(ctx: TaskContext, parents: list[int]) -> dict[str, Any]:
        by_id = await ctx.parents()
        return {"sum": sum(parents), "by_id": by_id}

    async with expert(app, concurrency=4):
        a = await app.submit(source, [3])
        b = await app.submit(double, depends_on=[a])
        c = await app.submit(square, depends_on=[a])
        d = await app.submit(join, depends_on=[b, c])
        out = await d.result(timeout=20)
    assert out == {"sum": 6 + 9, "by_id": {b.id: 6, c.id: 9}}


async def test_a_fan_in_gets_every_branch_in_order(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'fan.db'}")

    @app.task
    async def branch(n: int) -> int:
        return n * 10

    @app.task
    async def gather(parents: list[int]) -> list[int]:
        return parents

    async with expert(app, concurrency=8):
        branches = [await app.submit(branch, [n]) for n in range(12)]
        # given in reverse: the join gets them in the order of its depends_on
        joined = await app.submit(gather, depends_on=list(reversed(branches)))
        assert await joined.result(timeout=20) == [n * 10 for n in reversed(range(12))]


async def test_parents_are_not_passed_by_hand(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'bad.db'}")

    @app.task
    async def child(parents: list[int]) -> int:
        return len(parents)

    with pytest.raises(TaskError, match="parents"):
        await app.submit(child, kwargs={"parents": [1, 2]})
    store = await app.store()
    assert await store.list_tasks() == []
    async with expert(app):  # with no dependencies, the list is empty
        assert await (await app.submit(child)).result(timeout=10) == 0
    await app.aclose()


def test_tasks_show_prints_the_dependencies(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'show.db'}"
    (tmp_path / "show_app.py").write_text(
        "from contend import App\n"
        "app = App()\n"
        "@app.task\n"
        "def a() -> int:\n    return 1\n"
        "@app.task\n"
        "def b(parents: list[int]) -> int:\n    return sum(parents)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}

    def cli(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "contend", *argv, "--store", url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    parent = json.loads(cli("submit", "show_app:app", "a", "--json"))["id"]
    other = json.loads(cli("submit", "show_app:app", "a", "--json"))["id"]
    child = json.loads(
        cli(
            "submit",
            "show_app:app",
            "b",
            "--depends-on",
            parent,
            "--depends-on",
            f"{other}:run",
            "--json",
        )
    )["id"]
    shown = cli("tasks", "show", child)
    assert "depends on" in shown and parent in shown and "pending" in shown
    assert "if failed: fail" in shown and "if failed: run" in shown
    data = json.loads(cli("tasks", "show", child, "--json"))
    assert data["parents"] == [
        {"id": parent, "type": "a", "state": "pending", "if_failed": "fail"},
        {"id": other, "type": "a", "state": "pending", "if_failed": "run"},
    ]
    assert data["if_failed"] == ["fail", "run"]
    # a batch line names its edges' choices as objects
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"depends_on": [{"id": parent, "if_failed": "cancel"}]}) + "\n")
    (late,) = json.loads(cli("submit", "show_app:app", "b", "--batch", str(batch), "--json"))
    assert json.loads(cli("tasks", "show", late["id"], "--json"))["if_failed"] == ["cancel"]


async def test_a_run_edge_lets_the_child_run_with_none_for_the_failed_parent(
    tmp_path: Path,
) -> None:
    app = App(f"sqlite:///{tmp_path / 'run.db'}")

    @app.task
    async def good(n: int) -> int:
        return n

    @app.task(retries=1)
    async def bad() -> int:
        raise RuntimeError("no luck")

    @app.task
    async def report(ctx: TaskContext, parents: list[int | None]) -> dict[str, Any]:
        return {"parents": parents, "by_id": await ctx.parents()}

    @app.task
    async def strict(parents: list[int | None]) -> int:
        return len(parents)

    async with expert(app, concurrency=4):
        ok = await app.submit(good, [5])
        ko = await app.submit(bad)
        child = await app.submit(report, depends_on=[After(ko, if_failed="run"), ok])
        dropped = await app.submit(strict, depends_on=[After(ko.id, if_failed="cancel"), ok])
        died = await app.submit(strict, depends_on=[ko, ok])
        out = await child.result(timeout=20)
        with pytest.raises(TaskFailed):
            await dropped.result(timeout=20)
        with pytest.raises(TaskFailed):
            await died.result(timeout=20)
    assert out == {"parents": [None, 5], "by_id": {ko.id: None, ok.id: 5}}
    assert (await ko.get()).state in (TaskState.FAILED, TaskState.DEAD)
    assert (await died.get()).state == TaskState.DEAD
    gone = await (await app.store()).get(dropped.id, history=True)
    assert gone.state == TaskState.CANCELLED
    assert [e.event for e in gone.history] == ["cancelled"]
    assert ko.id in (gone.history[0].detail or "")
