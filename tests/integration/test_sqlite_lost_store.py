"""SQLite: the store's file is deleted, replaced or emptied under a running expert. Its
connection would go on writing into the file it opened (a ghost nobody else sees) or into the
WAL of a file that is no longer a store; it must stop with a clear SchemaError within a few
heartbeats instead, and write nothing into whatever is at the path now."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contend import Expert, SchemaError
from contend.store.port import Heartbeat
from contend.store.sqlite import SQLiteStore
from tests.integration.lease_faults import HEARTBEAT, LEASE, SideEffects, make_app, until

#: The expert must have stopped this long after the fault (a few heartbeats).
STOP_WITHIN = LEASE + 2 * HEARTBEAT


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def delete(path: Path) -> None:
    _remove(path)
    path.touch()  # an empty file where the store was, as `touch` or a careless tool leaves


def replace(path: Path) -> None:
    empty = path.with_name("empty.db")
    empty.touch()
    os.replace(empty, path)


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(0)


def _stat(path: Path) -> tuple[int, int] | None:
    """(size, modification time) of *path*, None when there is no such file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


FAULTS: dict[str, Callable[[Path], None]] = {
    "deleted": delete,
    "replaced": replace,
    "truncated": truncate,
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_an_expert_whose_file_is_gone_stops_and_writes_nothing_there(
    tmp_path: Path, fault: str
) -> None:
    path = tmp_path / "store.db"
    effects = SideEffects()
    app = make_app(f"sqlite:///{path}", effects)
    e = Expert(app, name="a", lease_ttl=LEASE, concurrency=1)
    runner = asyncio.create_task(e.run())
    try:
        await app.submit("work", [60.0])
        await until(lambda: effects.started("a"), 10, "the first run")
        FAULTS[fault](path)
        at = time.monotonic()
        wal = _stat(Path(f"{path}-wal"))  # the old file's WAL, left at the path but by deletion
        with pytest.raises(SchemaError, match=r"store\.db' was (deleted|replaced|emptied)"):
            await asyncio.wait_for(runner, STOP_WITHIN + 5)
        took = time.monotonic() - at
        print(f"\nSQLite, store file {fault}: the expert stopped after {took:.2f}s")
        assert took <= STOP_WITHIN, f"went on for {took:.2f}s"
        stopped = effects.stopped("a")
        assert stopped is not None and stopped - at <= STOP_WITHIN
        assert e.load == 0
        # No write landed at the path: the empty file is still empty, and the WAL there (the
        # old file's, but for a deletion) was not written to since.
        assert path.stat().st_size == 0
        assert _stat(Path(f"{path}-wal")) == wal
        assert (wal is None) == (fault == "deleted")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await app.aclose()
    if fault != "truncated":
        # Closing checkpoints only into the file the connection opened, not the one at the path
        # (SQLite sees it moved). A file truncated in place is the same file: closing writes
        # the old WAL's pages back into it (docs/sqlite.md says to delete, not truncate).
        assert path.stat().st_size == 0


async def test_an_expert_writes_nothing_into_a_new_store_at_its_path(tmp_path: Path) -> None:
    """The old file deleted and a new contend store made at the same path (a submitter that
    started meanwhile): the old expert stops, and the new store holds nothing of it."""
    path = tmp_path / "store.db"
    effects = SideEffects()
    app = make_app(f"sqlite:///{path}", effects)
    e = Expert(app, name="a", lease_ttl=LEASE, concurrency=1)
    runner = asyncio.create_task(e.run())
    new = SQLiteStore(f"sqlite:///{path}")
    try:
        await app.submit("work", [60.0])
        await until(lambda: effects.started("a"), 10, "the first run")
        _remove(path)
        await new.open()  # creates a new, empty store at the path
        with pytest.raises(SchemaError, match="was replaced"):
            await asyncio.wait_for(runner, STOP_WITHIN + 5)
        assert await new.list_experts() == []
        assert await new.list_tasks() == []
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await app.aclose()
        await new.close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM task_events").fetchone()[0] == 0
    db.close()


async def test_a_write_to_a_store_whose_tables_were_dropped_is_a_schema_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    try:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("DROP TABLE experts")
        other.close()
        with pytest.raises(SchemaError, match="lost its contend tables"):
            await store.renew("a", "s", 5.0, Heartbeat())
    finally:
        await store.close()
