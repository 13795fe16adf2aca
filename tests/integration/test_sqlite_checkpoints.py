"""SQLite checkpoints run on the store's own thread (store/sqlite/checkpoints.py), not inside a
commit on the event loop: the loop's connections checkpoint only past the fallback bound, the
thread copies the WAL back after writes, and closing the store stops it."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from contend.domain.task import TaskSpec
from contend.store.sqlite import SQLiteStore
from contend.store.sqlite.checkpoints import FALLBACK_PAGES, Checkpointer


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.01)


async def _pin(store: SQLiteStore, reader: sqlite3.Connection) -> None:
    """Open a read transaction on *reader* (its snapshot pins the WAL) and write through
    *store* until its checkpoint thread reports the WAL held back."""
    ckpt = store._db.checkpointer
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM tasks").fetchone()
    n = 0
    while not ckpt.pinned:
        await store.submit([TaskSpec.build("t", [n, i]) for i in range(500)])
        n += 1
        assert n < 200, f"never pinned; last checkpoint {ckpt.last}"


async def test_the_thread_checkpoints_what_the_store_writes(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 's.db'}")
    await store.open()
    db = store._db
    try:
        autocheckpoint = db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert autocheckpoint == FALLBACK_PAGES  # commits on the loop leave it to the thread
        for _ in range(20):
            await store.submit([TaskSpec.build("t", [i]) for i in range(50)])
        ckpt = db.checkpointer

        def caught_up() -> bool:
            last = ckpt.last
            return last is not None and last[0] > 0 and last[1] == last[0]

        # every frame the writes added is copied back to the file, by the thread
        await _until(caught_up, "a checkpoint that copied the whole WAL")
        assert ckpt.runs >= 1
        thread = ckpt._thread
        assert thread is not None and thread.name == "contend-sqlite-checkpoint"
    finally:
        await store.close()
    assert not thread.is_alive()  # closing the store stops it


async def test_a_closed_checkpointer_starts_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    sqlite3.connect(path).execute("PRAGMA journal_mode = WAL").fetchone()
    ckpt = Checkpointer(str(path), "NORMAL")
    ckpt.close()
    ckpt.poke()
    assert ckpt._thread is None and ckpt.runs == 0


async def test_a_reader_that_holds_the_wal_back_is_reported_and_the_wal_cut_back_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open read transaction keeps the WAL from being copied back: it grew to 6 GiB in five
    minutes of a sustained run, with nothing in the log to say why, and kept that size after."""
    keep = 2**20  # small, so that a test need not write 64 MiB
    monkeypatch.setattr("contend.store.sqlite.checkpoints.WAL_KEEP_BYTES", keep)
    path = tmp_path / "s.db"
    wal = tmp_path / "s.db-wal"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    ckpt = store._db.checkpointer
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        with caplog.at_level(logging.INFO, logger="contend.store.sqlite"):
            await _pin(store, reader)
            assert ckpt.last is not None and ckpt.last[0] - ckpt.last[1] >= FALLBACK_PAGES
            assert "a read transaction is holding the WAL back" in caplog.text
            reader.execute("COMMIT")
            await store.submit([TaskSpec.build("t", ["after"])])
            await _until(lambda: not ckpt.pinned, "the checkpoint after the reader ended")
            assert "the WAL is no longer held back" in caplog.text
        assert caplog.text.count("holding the WAL back") == 1  # said once, not per checkpoint
        held = wal.stat().st_size
        assert held > FALLBACK_PAGES * 4096
        await _until(lambda: ckpt.last is not None and ckpt.last[0] == ckpt.last[1], "all copied")
        await store.submit([TaskSpec.build("t", ["restarts the WAL"])])
        assert wal.stat().st_size <= keep, (held, wal.stat().st_size)
        # and the store's connection has its fallback bound again
        assert store._db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == FALLBACK_PAGES
    finally:
        reader.close()
        await store.close()


def _backfilled(path: Path) -> tuple[int, int]:
    """(frames in the WAL, frames copied back) as the WAL index in *path*-shm says: its header's
    ``mxFrame`` at byte 16 and the checkpoint record's ``nBackfill`` at byte 96, in the host's
    byte order (SQLite's "WAL-index format")."""
    head = Path(f"{path}-shm").read_bytes()[:100]
    return struct.unpack_from("=I", head, 16)[0], struct.unpack_from("=I", head, 96)[0]


async def test_a_writer_leaves_the_copy_of_a_held_wal_to_the_thread(tmp_path: Path) -> None:
    """While a reader holds the WAL back, the store's connections have no automatic checkpoint:
    the first commit after the reader let go copied the whole WAL back inside ``COMMIT`` on the
    event loop, 6 GiB after a five-minute hold (a 10-s window of pickup p99 1,674 ms)."""
    path = tmp_path / "s.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    ckpt = store._db.checkpointer
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        await _pin(store, reader)
        await store.submit([TaskSpec.build("t", ["held"])])
        assert store._db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        await asyncio.to_thread(ckpt.close)  # the thread copies nothing more from here
        reader.execute("COMMIT")
        await store.submit([TaskSpec.build("t", ["after"])])
        frames, copied = _backfilled(path)
        assert frames > FALLBACK_PAGES and copied < frames, (frames, copied)
    finally:
        reader.close()
        await store.close()


class _Answers:
    """A connection whose checkpoints answer these rows, in turn."""

    def __init__(self, rows: list[tuple[int, int, int]]) -> None:
        self.rows = rows

    def execute(self, sql: str) -> _Answers:
        assert sql == "PRAGMA wal_checkpoint(PASSIVE)"
        return self

    def fetchone(self) -> tuple[int, int, int]:
        return self.rows.pop(0)


def test_a_checkpoint_another_connection_blocked_says_nothing_of_a_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Several processes on one file checkpoint it in turn, and one that finds another at it
    gets (1, -1, -1). Taken for "nothing held back", it made the next checkpoint report the
    held reader again: five warnings a second in a sustained run."""
    ckpt = Checkpointer(str(tmp_path / "s.db"), "NORMAL")
    held = FALLBACK_PAGES + 100
    rows = [(0, held, 100), (1, -1, -1), (0, held + 50, 100), (1, -1, -1), (0, held + 99, 100)]
    with caplog.at_level(logging.INFO, logger="contend.store.sqlite"):
        for _ in range(len(rows)):
            ckpt._checkpoint(_Answers(rows))  # type: ignore[arg-type]
            assert ckpt.pinned
    assert caplog.text.count("holding the WAL back") == 1
    assert "no longer held back" not in caplog.text
    assert ckpt.last == (held + 99, 100)
