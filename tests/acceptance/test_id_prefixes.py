"""Task id prefixes on the command line (``contend tasks show 01a231d2``), end to end: the
real CLI in subprocesses on a real SQLite file.

Ids that must share a prefix are written with the store's API beforehand, so that the
ambiguous cases do not hang on which millisecond the CLI's ids fall in.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from contend.domain.task import TaskSpec
from contend.store.registry import open_store
from tests.acceptance.conftest import APP, run_cli
from tests.acceptance.test_cli_surprises import one_line_error

TWINS = ("0a0a0a0a" + "0" * 20, "0a0a0a0a" + "0" * 19 + "1")  # share 27 characters
CROWD = tuple(f"0c0c0c{n:022x}" for n in range(12))  # more than the message counts


async def _seed(url: str, ids: tuple[str, ...]) -> None:
    store = await open_store(url)
    try:
        await store.submit([replace(TaskSpec.build("echo", ["x"]), id=tid) for tid in ids])
    finally:
        await store.close()


def _states(url: str) -> dict[str, str]:
    done = run_cli("tasks", "list", "--store", url, "--json")
    assert done.returncode == 0, done.stderr
    return {t["id"]: t["state"] for t in json.loads(done.stdout)}


def test_a_unique_prefix_names_its_task(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'unique.db'}"
    asyncio.run(_seed(url, TWINS))
    task_id = run_cli("submit", APP, "echo", "--args", "[1]", "--store", url).stdout.strip()
    prefix = task_id[:14]  # the creation millisecond and two random digits
    shown = run_cli("tasks", "show", prefix, "--store", url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == task_id
    cancelled = run_cli("tasks", "cancel", prefix.upper(), "--store", url)  # either case
    assert (cancelled.returncode, cancelled.stdout) == (0, f"{task_id} cancelled\n")
    retried = run_cli("tasks", "retry", TWINS[1][:-1] + "1", "--store", url)  # a whole id
    assert retried.returncode == 2 and "cannot retry task" in retried.stderr
    retried = run_cli("tasks", "retry", task_id[:14], "--store", url)
    assert (retried.returncode, retried.stdout) == (0, f"{task_id} pending\n")
    child = run_cli(
        "submit", APP, "echo", "--args", "[2]", "--depends-on", f"{prefix}:cancel",
        "--store", url, "--json",
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    child_id = json.loads(child.stdout)["id"]
    data = json.loads(run_cli("tasks", "show", child_id[:26], "--store", url, "--json").stdout)
    assert (data["depends_on"], data["if_failed"]) == ([task_id], ["cancel"])


def test_an_ambiguous_prefix_names_its_tasks_and_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'twins.db'}"
    asyncio.run(_seed(url, TWINS + CROWD))
    before = _states(url)
    done = run_cli("tasks", "cancel", "0a0a0a0a", "--store", url)
    assert done.returncode == 2
    one_line_error(
        done,
        f"'0a0a0a0a' is ambiguous: it starts 2 tasks ({TWINS[0]}, {TWINS[1]}); "
        "give more characters",
    )
    crowd = run_cli("tasks", "show", "0C0C0C", "--store", url)
    assert crowd.returncode == 2
    one_line_error(crowd, "'0C0C0C' is ambiguous: it starts more than 10 tasks", CROWD[3], ", …")
    assert CROWD[4] not in crowd.stderr
    dep = run_cli(
        "submit", APP, "echo", "--args", "[1]", "--depends-on", "0a0a0a0a", "--store", url
    )
    assert dep.returncode == 2
    one_line_error(dep, "'0a0a0a0a' is ambiguous: it starts 2 tasks")
    assert _states(url) == before  # nothing cancelled, nothing submitted


def test_an_unknown_or_short_prefix_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'none.db'}"
    asyncio.run(_seed(url, TWINS))
    before = _states(url)
    for command in ("show", "retry", "cancel"):
        done = run_cli("tasks", command, "0b0b0b", "--store", url)
        assert done.returncode == 2
        one_line_error(done, "no task id starts with '0b0b0b'")
    short = run_cli("tasks", "cancel", "0a0a0", "--store", url)
    assert short.returncode == 2
    one_line_error(short, "'0a0a0' is too short to name a task: give at least 6")
    dep = run_cli(
        "submit", APP, "echo", "--args", "[1]", "--depends-on", "0a0a0:run", "--store", url
    )
    assert dep.returncode == 2
    one_line_error(dep, "'0a0a0' is too short to name a task")
    word = run_cli("tasks", "show", "nope", "--store", url)  # not hex: looked up as it is
    assert word.returncode == 2
    one_line_error(word, "no task with id 'nope'", "task ids are 28 hex digits")
    assert _states(url) == before
