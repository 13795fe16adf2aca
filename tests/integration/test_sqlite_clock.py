"""SQLite's store clock (store/sqlite/clock.py): one offset per boot, shared by every process
of the host, and a new boot ends the leases of the last one."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import ExpertInfo
from contend.store.sqlite import SQLiteStore
from contend.store.sqlite.clock import HostClock, boot_id, boottime


def meta(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT key, value FROM contend_meta").fetchall())


async def test_every_process_of_a_boot_reads_one_offset(tmp_path: Path) -> None:
    assert boot_id() is not None  # Linux: the tests run where the clock is anchored
    url = f"sqlite:///{tmp_path / 's.db'}"
    first, second = SQLiteStore(url), SQLiteStore(url)
    await first.open()
    await second.open()
    try:
        a, b = first._host_clock, second._host_clock
        assert a is not None and b is not None
        assert a.offset is not None and a.offset == b.offset
        assert abs(await first.now() - time.time()) < 1.0  # on the wall clock's scale
        assert '"boot"' in meta(tmp_path / "s.db")["clock"]
    finally:
        await first.close()
        await second.close()


async def test_a_new_boot_ends_the_leases_of_the_last(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    old = SQLiteStore(f"sqlite:///{path}", clock=None)
    old._host_clock = HostClock(boot="an-earlier-boot")
    old._db.clock = old._host_clock
    await old.open()
    await old.submit([TaskSpec.build("t")])
    session = await old.register_expert(ExpertInfo("a"), 3600.0)
    got = await old.claim("a", session, ["default"], Capabilities(), limit=1, lease_ttl=3600)
    assert len(got) == 1
    await old.close()

    new = SQLiteStore(f"sqlite:///{path}")  # this boot: the last one's processes are gone
    await new.open()
    try:
        assert await new.expire() == 1
        (task,) = await new.list_tasks()
        assert task.state == "pending"
        (expert,) = await new.list_experts()
        assert not expert.alive
    finally:
        await new.close()


async def test_a_read_only_open_writes_no_offset(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    writer = SQLiteStore(f"sqlite:///{path}")
    await writer.open()
    await writer.close()
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM contend_meta WHERE key = 'clock'")
    before = path.read_bytes()
    reader = SQLiteStore(f"sqlite:///{path}", create=False)
    await reader.open()
    try:
        assert abs(await reader.now() - time.time()) < 1.0
        assert "clock" not in meta(path)
    finally:
        await reader.close()
    assert path.read_bytes() == before


def test_the_clock_is_boot_time_plus_the_offset() -> None:
    clock = HostClock(boot="b")
    assert abs(clock() - time.time()) < 1.0  # not anchored: the wall clock
    clock.offset = 1_000.0
    assert abs(clock() - (1_000.0 + boottime())) < 0.1
