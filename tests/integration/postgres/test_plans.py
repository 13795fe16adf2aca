"""Statements whose cached plan may be made while the store is new, on a real PostgreSQL.

psycopg prepares a statement after a few runs and the server then keeps a generic plan, made
for the tables' size at that moment, until statistics change (the first ANALYZE). A plan made
for an almost empty ``tasks`` table may scan it whole; these tests make such a plan on
purpose (the planner told to avoid the other joins) and check that the common case still
reads nothing of the table, whichever side of the join the plan puts it.
"""

from __future__ import annotations

import re

import psycopg

from contend.domain.task import TaskSpec
from contend.store.postgres import PostgresStore
from contend.store.postgres.dependants import WAITING_ON
from contend.store.postgres.submission import STATISTICS_AFTER

GROWN = 20_000


def _grow(conn: psycopg.Connection, n: int) -> None:
    """*n* more succeeded tasks, copies of the first one under new ids."""
    conn.execute(
        "INSERT INTO contend.tasks SELECT (jsonb_populate_record(NULL::contend.tasks,"
        " to_jsonb(t) || jsonb_build_object('id', 'grown-' || g, 'state', 'succeeded'))).*"
        " FROM contend.tasks t, generate_series(1, %s) g"
        " WHERE t.id = (SELECT min(id) FROM contend.tasks)",
        (n,),
    )


def _prepared(sql: str) -> str:
    """*sql* of the store, as the server's PREPARE takes it."""
    return re.sub(r"%\((\w+)\)s", "$1", sql.replace("{s}", '"contend"'))


async def test_ending_a_task_without_dependants_reads_nothing_of_the_tasks(
    store: PostgresStore, pg_url: str
) -> None:
    await store.submit([TaskSpec.build("t", [n]) for n in range(3)])
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _grow(conn, GROWN)
        # a nested loop, as the plan made for a small table was (which side is outer is the
        # planner's choice: with the tasks outside, it read the whole table on every call)
        conn.execute("SET enable_hashjoin = off")
        conn.execute("SET enable_mergejoin = off")
        conn.execute(f"PREPARE waiting_on(text[]) AS {_prepared(WAITING_ON)}")
        plan = [
            r[0]
            for r in conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) EXECUTE waiting_on('{a,b}')"
            )
        ]
    text = "\n".join(plan)
    # the join stands under a filter decided once, before either side is read: whichever
    # side the plan puts outside, an empty removal reads nothing of the tasks
    gates = [n for n, line in enumerate(plan) if "One-Time Filter" in line]
    join = next(n for n, line in enumerate(plan) if "Nested Loop" in line)
    assert gates and gates[0] < join, text
    assert "never executed" in plan[join], text
    executed = text.split("\nPlanning")[0]  # planning reads the catalogs, not the table
    hits = max(int(m) for m in re.findall(r"shared hit=(\d+)", executed))
    assert hits < 50, text


async def test_a_new_store_analyzes_its_tasks_once_it_has_some(
    store: PostgresStore, pg_url: str
) -> None:
    # plans cached while the table was nearly empty stay until its statistics change: the
    # commit's update scanned the whole table until autovacuum's first analyze (never, where
    # autovacuum is off, as on this project's test server)
    def analyzed() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(analyze_count + autoanalyze_count, 0) FROM pg_stat_user_tables"
                " WHERE schemaname = 'contend' AND relname = 'tasks'"
            ).fetchone()
            assert row is not None
            return int(row[0])

    await store.submit([TaskSpec.build("t", [n]) for n in range(STATISTICS_AFTER - 1)])
    assert analyzed() == 0
    await store.submit([TaskSpec.build("t", ["one more"])])
    assert analyzed() == 1
    await store.submit([TaskSpec.build("t", [n]) for n in range(STATISTICS_AFTER)])
    assert analyzed() == 1  # once per instance
