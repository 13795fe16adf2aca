"""Ageing on a real PostgreSQL, where each pending task's effective priority is a column:
housekeeping writes none of it while every task submitted had priority 0 (ageing from the due
time could not change their order, and its writes slowed a 100,000-task drain by about a
fifth), and its first sweep after another priority appears catches every waiting task up."""

from __future__ import annotations

import psycopg

from contend.domain.task import TaskSpec
from contend.store.postgres import PostgresStore
from contend.testing import FakeClock


async def _eff(pg_url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT id, eff_priority FROM contend.tasks")
        return dict(await cur.fetchall())


async def test_no_ageing_writes_until_a_priority_other_than_0(
    store: PostgresStore, clock: FakeClock, pg_url: str
) -> None:
    old = [TaskSpec.build("t", [n]) for n in range(3)]
    await store.submit(old)
    clock.advance(60.0)  # e^4 - 1 ≈ 54.6 s: aged to 4, were it written
    await store.expire()
    assert set((await _eff(pg_url)).values()) == {0}
    urgent = TaskSpec.build("t", priority=3)
    await store.submit([urgent])
    await store.expire()
    aged = await _eff(pg_url)
    assert [aged[s.id] for s in old] == [4, 4, 4]
    assert aged[urgent.id] == 3
