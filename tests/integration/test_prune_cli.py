"""``contend prune`` on a real SQLite file: old finished tasks go, bad input changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from contend.domain.task import TaskSpec
from contend.store.sqlite import SQLiteStore


def contend(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    return subprocess.run(
        [sys.executable, "-m", "contend", *argv], capture_output=True, text=True, env=env
    )


async def test_prune_deletes_finished_tasks_and_refuses_bad_ages(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    url = f"sqlite:///{path}"
    store = SQLiteStore(url)
    await store.open()
    done = [TaskSpec.build("job") for _ in range(3)]
    kept = TaskSpec.build("job")
    await store.submit([*done, kept])
    for t in done:
        await store.cancel(t.id)
    await store.close()

    before = path.read_bytes()
    for bad, says in [("7x", "not an age"), ("-1d", "not an age")]:
        out = contend("prune", "--store", url, f"--older-than={bad}")
        assert out.returncode == 2 and says in out.stderr, out.stderr
    out = contend("prune", "--store", url, "--older-than", "1d", "--batch", "0")
    assert out.returncode == 2 and "--batch" in out.stderr
    assert path.read_bytes() == before

    out = contend("prune", "--store", url, "--older-than", "0s", "--batch", "2")
    assert out.returncode == 0, out.stderr
    assert "pruned 3 finished task(s)" in out.stdout
    store = SQLiteStore(url)
    await store.open()
    try:
        assert [t.id for t in await store.list_tasks()] == [kept.id]
    finally:
        await store.close()

    missing = contend("prune", "--store", f"sqlite:///{tmp_path / 'none.db'}", "--older-than", "1d")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not (tmp_path / "none.db").exists()
