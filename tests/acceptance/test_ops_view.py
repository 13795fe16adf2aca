"""What an operator sees of pipelines and graphs, end to end: ``contend status`` with an app
gives each pipeline stage's backlog and rate while a real expert runs it, and ``contend tasks
show`` gives a task's children as well as its parents, on a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contend.store.registry import open_store
from tests.acceptance.conftest import APP, Experts, run_cli, wait_until

PIPELINE_APP = "tests.acceptance.pipeline_app:app"
STAGES = ["words.split", "words.upper", "words.count"]


def _status(url: str) -> tuple[str, dict[str, Any]]:
    """``contend status --app`` as text, and its ``--json`` stages by name."""
    text = run_cli("status", "--store", url, "--app", PIPELINE_APP)
    assert text.returncode == 0, text.stderr
    doc = run_cli("status", "--store", url, "--app", PIPELINE_APP, "--json")
    assert doc.returncode == 0, doc.stderr
    stages = json.loads(doc.stdout)["pipelines"]["words"]
    assert [s["stage"] for s in stages] == STAGES
    return text.stdout, {s["stage"]: s for s in stages}


def _row(text: str, stage: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.split()[1:2] == [stage]]
    return line.split()


async def test_status_shows_each_stage_backlog_and_rate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    gate = tmp_path / "gate"
    record = json.dumps([[{"text": "a b c d", "gate": str(gate)}]])
    for _ in range(3):  # 3 first-stage tasks -> 6 of upper -> 6 of count
        sub = run_cli("submit", PIPELINE_APP, "words.split", "--store", url, "--args", record)
        assert sub.returncode == 0, sub.stderr
    text, stages = _status(url)
    assert "pipelines (rate: tasks done a second over the last minute)" in text
    assert _row(text, "words.split") == ["words", "words.split", "3", "0", "0", "0.00", "0", "-"]
    assert stages["words.split"]["pending"] == 3 and stages["words.split"]["backlog"] == 3
    assert stages["words.upper"]["backlog"] == 0
    bare = run_cli("status", "--store", url)  # without the app: no pipeline is known
    assert bare.returncode == 0 and "pipelines" not in bare.stdout

    store = await open_store(url)
    experts = Experts(url, tmp_path)
    try:
        experts.start("e1", app=PIPELINE_APP, concurrency=8)

        async def held_at_the_last_stage() -> bool:
            c = (await store.stats()).counts
            return (
                c.get("words.upper", {}).get("succeeded") == 6
                and c.get("words.count", {}).get("running") == 6
            )

        await wait_until(held_at_the_last_stage, what="6 count tasks running", watch=experts)
        text, stages = _status(url)
        assert [stages[s]["done_last_minute"] for s in STAGES] == [3, 6, 0]
        assert stages["words.count"]["running"] == 6 and stages["words.count"]["backlog"] == 6
        assert stages["words.split"]["rate_per_s"] == 3 / 60
        assert _row(text, "words.upper")[2:6] == ["0", "0", "6", "0.10"]
        assert _row(text, "words.count")[2:6] == ["0", "6", "0", "0.00"]

        gate.touch()

        async def all_counted() -> bool:
            c = (await store.stats()).counts
            return c.get("words.count", {}).get("succeeded") == 6

        await wait_until(all_counted, what="the last stage done", watch=experts)
        text, stages = _status(url)
        assert [stages[s]["done_last_minute"] for s in STAGES] == [3, 6, 6]
        assert [stages[s]["backlog"] for s in STAGES] == [0, 0, 0]
        assert _row(text, "words.count")[2:6] == ["0", "0", "6", "0.10"]
    finally:
        experts.stop_all()
        await store.close()


def _submit(url: str, *deps: str) -> str:
    extra = [x for d in deps for x in ("--depends-on", d)]
    sub = run_cli("submit", APP, "echo", "--store", url, "--args", '["x"]', *extra)
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.strip()


def _show(url: str, task_id: str) -> tuple[str, dict[str, Any]]:
    text = run_cli("tasks", "show", task_id, "--store", url)
    assert text.returncode == 0, text.stderr
    doc = run_cli("tasks", "show", task_id, "--store", url, "--json")
    assert doc.returncode == 0, doc.stderr
    return text.stdout, json.loads(doc.stdout)


def _edges(doc: dict[str, Any], side: str) -> dict[str, tuple[str, str]]:
    return {e["id"]: (e["state"], e["if_failed"]) for e in doc[side]}


async def test_tasks_show_gives_children_and_parents_of_a_diamond(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'graph.db'}"
    a = _submit(url)
    b = _submit(url, a)
    c = _submit(url, f"{a}:run")
    d = _submit(url, b, f"{c}:cancel")

    text, doc = _show(url, a)
    assert _edges(doc, "children") == {b: ("waiting", "fail"), c: ("waiting", "run")}
    assert doc["parents"] == [] and doc["more_children"] is False
    assert "needed by:" in text and "depends on:" not in text
    assert f"{c}  echo             waiting    if this fails: run" in text
    _, doc = _show(url, b)
    assert _edges(doc, "parents") == {a: ("pending", "fail")}
    assert _edges(doc, "children") == {d: ("waiting", "fail")}
    _, doc = _show(url, c)
    assert _edges(doc, "children") == {d: ("waiting", "cancel")}
    text, doc = _show(url, d)
    assert _edges(doc, "parents") == {b: ("waiting", "fail"), c: ("waiting", "cancel")}
    assert doc["children"] == [] and "needed by:" not in text

    store = await open_store(url)
    experts = Experts(url, tmp_path)
    try:
        experts.start("e1")

        async def finished() -> bool:
            return (await store.get(d)).state == "succeeded"

        await wait_until(finished, what="the diamond done", watch=experts)
    finally:
        experts.stop_all()
        await store.close()
    # The edges were settled and deleted as the graph ran: the children are still found.
    text, doc = _show(url, a)
    assert _edges(doc, "children") == {b: ("succeeded", "fail"), c: ("succeeded", "run")}
    assert f"{b}  echo             succeeded  if this fails: fail" in text
