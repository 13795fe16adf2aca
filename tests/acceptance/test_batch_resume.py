"""``contend submit --batch`` is resumable: a submitter killed with kill -9 in the middle of a
large batch leaves whole chunks behind, and running the same command again completes the batch
without a duplicate (each line's idempotency key comes from the file's content and the line)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from contend.store.port import Store
from tests.acceptance.conftest import APP, ROOT, cli_env, run_cli, wait_until

LINES = 30_000  # 30 chunks of 1,000: the kill lands between the first and the last


async def count_tasks(store: Store) -> int:
    stats = await store.stats()
    return sum(sum(by_state.values()) for by_state in stats.counts.values())


async def test_a_batch_killed_midway_completes_when_run_again(
    db_url: str, store: Store, tmp_path: Path
) -> None:
    batch = tmp_path / "big.jsonl"
    with batch.open("w") as fh:
        for i in range(LINES):
            line = {"args": [i]}
            if i % 1000 == 7:
                line["key"] = f"own-{i}"  # a line's own key is kept
            fh.write(json.dumps(line) + "\n")
    argv = [sys.executable, "-m", "contend", "submit", APP, "echo", "--store", db_url]
    submitter = subprocess.Popen(
        [*argv, "--batch", str(batch)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=cli_env(),
        cwd=ROOT,
    )
    try:

        async def first_chunk_committed() -> bool:
            assert submitter.poll() is None, "the submitter ended before the kill"
            return bool(await store.list_tasks(limit=1))

        await wait_until(first_chunk_committed, timeout=120, what="the first committed chunk")
        submitter.send_signal(signal.SIGKILL)
        assert submitter.wait(timeout=30) == -signal.SIGKILL
    finally:
        if submitter.poll() is None:
            submitter.kill()
            submitter.wait()
        assert submitter.stderr is not None
        submitter.stderr.close()
    left = await count_tasks(store)
    assert 0 < left < LINES, f"the kill did not land mid-batch: {left} of {LINES} stored"

    again = run_cli("submit", APP, "echo", "--store", db_url, "--batch", str(batch), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"submitted {LINES - left} task(s), {left} already present" in again.stderr
    tasks = await store.list_tasks(limit=LINES + 1)
    assert sorted(t.args[0] for t in tasks) == list(range(LINES))  # each line once
    keys = {t.args[0]: t.key for t in tasks}
    assert keys[7] == "own-7" and keys[29_007] == "own-29007"
    assert keys[0] is not None and keys[0].startswith("batch:")
    assert again.stdout.split() == [t.id for t in sorted(tasks, key=lambda t: t.args[0])]
