"""SQLite wake-ups: an idle waiter learns of another process's commit at once (the WAL watch),
after any length of idleness, and at most POLL_CAP late where there is no watch."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from contend.store.sqlite import SQLiteStore, wakeups


def commit_soon(path: Path, after: float, at: list[float]) -> threading.Thread:
    """Another connection (as another process would) commits a row *after* seconds; the
    moment its commit returned goes into *at*."""

    def run() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous = NORMAL")  # as contend's own connections
        time.sleep(after)  # the other process's own schedule, not a wait for this test
        conn.execute("INSERT INTO contend_meta VALUES ('poke', ?)", (str(time.time()),))
        at.append(time.monotonic())
        conn.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def _woken_after(store: SQLiteStore, path: Path, idle: float) -> float:
    """Seconds from another connection's commit to the waiter's return, the waiter having
    been idle for *idle* seconds before it."""
    await store.wait_for_change(0)  # note the current version
    at: list[float] = []
    thread = commit_soon(path, idle, at)
    await store.wait_for_change(idle + 5)
    woke = time.monotonic()
    await asyncio.to_thread(thread.join)
    return woke - at[0]  # a little below 0 when woken between the WAL write and the return


@pytest.mark.parametrize("idle", [0.05, 2.0])
async def test_an_idle_waiter_wakes_at_once_on_a_commit(tmp_path: Path, idle: float) -> None:
    path = tmp_path / "w.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    try:
        late = await _woken_after(store, path, idle)
        print(f"\nwoken {late * 1000:.1f} ms after a commit, idle {idle}s before it")
        assert -0.01 < late < 0.1  # the backed-off poll alone would be up to 0.5 s late
        assert store._db.wakeups._watch is not None
    finally:
        await store.close()
    assert store._db.wakeups._watch is None  # closed with the store


async def test_without_a_watch_the_poll_backs_off_to_its_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wakeups.WalWatch, "start", classmethod(lambda cls, wal, cb: None))
    path = tmp_path / "w.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    try:
        late = await _woken_after(store, path, 2.0)
        print(f"\nno watch: woken {late * 1000:.1f} ms after a commit")
        assert -0.01 < late < wakeups.POLL_CAP + 0.05
    finally:
        await store.close()
