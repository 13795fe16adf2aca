"""The real ``contend expert`` whose store file is deleted under it: it exits with code 2 and a
message that names the file and says what happened, and leaves nothing at the path."""

from __future__ import annotations

import time
from pathlib import Path

from contend.domain.task import TaskSpec, TaskState
from contend.store.sqlite import SQLiteStore
from tests.acceptance.conftest import Experts, wait_until


async def test_an_expert_whose_store_file_was_deleted_exits_2_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    experts = Experts(f"sqlite:///{path}", tmp_path)
    try:
        spec = TaskSpec.build("slow", [60.0])
        await store.submit([spec])
        proc = experts.start("doomed", lease=1.5, concurrency=1)

        async def running() -> bool:
            return (await store.get(spec.id)).state == TaskState.RUNNING

        await wait_until(running, what="the task to run", watch=experts)
        await store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink()
        path.touch()
        deleted = time.monotonic()
        code = proc.wait(timeout=30)
        took = time.monotonic() - deleted
        log = experts.log("doomed")
        assert code == 2, log[-3000:]
        assert f"contend: error: the SQLite store '{path}' was replaced by another file" in log
        assert "Traceback" not in log
        assert took < 10
        assert path.stat().st_size == 0
        assert not Path(f"{path}-wal").exists()
    finally:
        experts.stop_all()
        await store.close()
