"""A SQLite file of schema version 1 (before progress and trace contexts) is upgraded in place
when a newer contend opens it: its tasks stay, and the new columns work."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from contend.domain.limits import Rate
from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import ExpertInfo
from contend.store.sqlite import SQLiteStore
from contend.store.sqlite.schema import SCHEMA_VERSION


async def test_a_version_1_file_is_upgraded_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    store = SQLiteStore(url)
    await store.open()
    old = TaskSpec.build("job", [1])
    await store.submit([old])
    await store.close()
    # make it the file contend wrote before version 2
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE tasks DROP COLUMN progress")
    db.execute("ALTER TABLE tasks DROP COLUMN trace")
    db.execute("DROP INDEX tasks_lane")
    db.execute("DROP INDEX tasks_claimable")
    db.execute("DROP INDEX tasks_central")
    db.execute("DROP TABLE leaders")
    db.execute("ALTER TABLE tasks DROP COLUMN central")
    db.execute("ALTER TABLE tasks DROP COLUMN assignee")
    db.execute(
        "CREATE INDEX tasks_claimable ON tasks (queue, eff_priority DESC, run_at, id) "
        "WHERE state = 'pending'"
    )
    db.execute("ALTER TABLE auctions DROP COLUMN grace")
    db.execute("DROP INDEX tasks_limited")
    db.execute("ALTER TABLE tasks DROP COLUMN limit_key")
    db.execute("ALTER TABLE tasks DROP COLUMN limit_max")
    db.execute("ALTER TABLE tasks DROP COLUMN if_failed")
    db.execute("DROP INDEX tasks_fair")
    db.execute("ALTER TABLE tasks DROP COLUMN rate_interval")
    db.execute("ALTER TABLE tasks DROP COLUMN rate_burst")
    db.execute("ALTER TABLE tasks DROP COLUMN fair_key")
    db.execute("DROP TABLE rate_keys")
    db.execute("UPDATE contend_meta SET value = '1' WHERE key = 'schema_version'")
    db.commit()
    db.close()

    store = SQLiteStore(url)
    await store.open()
    try:
        assert (await store.get(old.id)).args == [1]
        new = TaskSpec.build(
            "job", [2], trace={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        )
        child = TaskSpec.build("job", depends_on=[old.id], if_failed=["run"])
        rated = TaskSpec.build("job", limit_key="k", rate_limit=Rate.of("5/s"), fair=True)
        await store.submit([new, child, rated])
        assert (await store.get(child.id)).if_failed == ("run",)
        # version 5: central queues (the old task is a compete one, claimable as before)
        info = ExpertInfo("e")
        session = await store.register_expert(info, 10.0)
        assert await store.lead("e", session, "q", 10.0) == 1
        claimed = await store.claim(
            "e", session, ["default"], Capabilities(), limit=1, lease_ttl=10
        )
        assert [c.id for c in claimed] == [old.id]
        assert (await store.get(new.id)).trace == {
            "traceparent": new.trace and "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
        }
    finally:
        await store.close()
    db = sqlite3.connect(path)
    (version,) = db.execute("SELECT value FROM contend_meta WHERE key='schema_version'").fetchone()
    lane = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'tasks_lane'").fetchall()
    rate = db.execute("SELECT key, interval FROM rate_keys").fetchall()
    claimable = db.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'tasks_claimable'"
    ).fetchone()[0]
    db.close()
    assert int(version) == SCHEMA_VERSION == 6
    assert lane  # the low lane's index came with version 3
    assert rate == [("k", 0.2)]  # rate limits came with version 4
    assert "central = 0" in claimable  # version 5 left central tasks out of the claim order
