"""Ageing in a real SQLite file, where each pending task's effective priority is a column:
housekeeping writes none of it while every task submitted had priority 0 (ageing from the due
time could not change their order), its first sweep after another priority appears catches
every waiting task up, and a file whose tasks had other priorities before the upgrade that
brought this ages on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from contend.domain.task import TaskSpec
from contend.store.sqlite import SQLiteStore
from contend.testing import FakeClock


def _eff(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT id, eff_priority FROM tasks").fetchall())


async def test_no_ageing_writes_until_a_priority_other_than_0(tmp_path: Path) -> None:
    path, clock = tmp_path / "s.db", FakeClock()
    store = SQLiteStore(f"sqlite:///{path}", clock=clock)
    await store.open()
    try:
        old = [TaskSpec.build("t", [n]) for n in range(3)]
        await store.submit(old)
        clock.advance(60.0)  # e^4 - 1 ≈ 54.6 s: aged to 4, were it written
        await store.expire()
        assert set(_eff(path).values()) == {0}
        urgent = TaskSpec.build("t", priority=3)
        await store.submit([urgent])
        await store.expire()
        aged = _eff(path)
        assert [aged[s.id] for s in old] == [4, 4, 4]
        assert aged[urgent.id] == 3
    finally:
        await store.close()


async def test_an_upgraded_file_restarts_ageing_from_the_due_time(tmp_path: Path) -> None:
    path, clock = tmp_path / "s.db", FakeClock()
    store = SQLiteStore(f"sqlite:///{path}", clock=clock)
    await store.open()
    low, delayed = TaskSpec.build("t", priority=-1), TaskSpec.build("t", delay=30.0)
    await store.submit([low, delayed])
    await store.close()
    # a version 5 file: ageing from creation had raised the delayed task, and no key says
    # that priorities other than 0 were submitted
    with sqlite3.connect(path) as db:
        db.execute("UPDATE tasks SET eff_priority = 3, promote_at = 0 WHERE id = ?", (delayed.id,))
        db.execute("DELETE FROM contend_meta WHERE key = 'levels'")
        db.execute("UPDATE contend_meta SET value = '5' WHERE key = 'schema_version'")
    store = SQLiteStore(f"sqlite:///{path}", clock=clock)
    await store.open()
    try:
        assert _eff(path)[delayed.id] == 0  # unaged from its due time, 30 s ahead
        clock.advance(30.0 + 7.0)  # e^2 - 1 ≈ 6.4 s after it was due: aged to 2
        await store.expire()  # the file had a priority other than 0: ageing goes on
        assert _eff(path) == {low.id: 2, delayed.id: 2}
    finally:
        await store.close()
