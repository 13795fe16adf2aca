"""PostgreSQL submission: every field of a mixed batch arrives as it was sent (the rows travel
as one JSON document, a value left out when it is None), and a key's rate is the one the
batch's last task on it declared."""

from __future__ import annotations

import psycopg
import pytest

from contend.domain.limits import Rate
from contend.domain.task import TaskSpec, TaskState
from contend.store.postgres import PostgresStore


async def test_a_mixed_batch_keeps_every_field(store: PostgresStore) -> None:
    first = TaskSpec.build(
        "plain", [1, "two", {"three": None}], {"k": [1.5, True]}, priority=7, timeout=2.5
    )
    rich = TaskSpec.build(
        "rich",
        ['quote " and \\ backslash', "ünïcode"],
        queue="q2",
        key="the-key",
        requirements={"tags": ["gpu"], "resources": {"mem": 2.0}, "prefer": ["zone:eu"]},
        delay=30.0,
        max_attempts=5,
        trace={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        limit_key="tenant-1",
        concurrency_limit=2,
        fair=True,
    )
    dependant = TaskSpec.build("after", depends_on=[first.id, rich.id], if_failed=["run", "cancel"])
    sent = await store.submit([first, rich, dependant])
    assert [s.created for s in sent] == [True, True, True]

    a = await store.get(first.id)
    assert (a.type, a.queue, a.state, a.priority) == ("plain", "default", TaskState.PENDING, 7)
    assert (a.args, a.kwargs, a.timeout, a.key) == (
        [1, "two", {"three": None}],
        {"k": [1.5, True]},
        2.5,
        None,
    )
    assert a.requirements == first.requirements and a.trace is None and a.depends_on == ()

    b = await store.get(rich.id)
    assert (b.queue, b.key, b.max_attempts, b.args) == (
        "q2",
        "the-key",
        5,
        ['quote " and \\ backslash', "ünïcode"],
    )
    assert b.requirements == rich.requirements
    assert b.run_at - b.created_at == pytest.approx(30.0)
    assert b.trace == {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    assert (b.limit_key, b.concurrency_limit, b.fair) == ("tenant-1", 2, True)

    c = await store.get(dependant.id)
    assert c.state == TaskState.WAITING
    assert c.depends_on == (first.id, rich.id) and c.if_failed == ("run", "cancel")


async def test_the_last_rate_a_batch_declares_for_a_key_holds(
    store: PostgresStore, pg_url: str
) -> None:
    specs = [
        TaskSpec.build("r", limit_key="k", rate_limit=Rate(interval=1.0, burst=1)),
        TaskSpec.build("r", limit_key="k", rate_limit=Rate(interval=4.0, burst=3)),
        TaskSpec.build("r", limit_key="other", rate_limit=Rate(interval=0.5, burst=1)),
        TaskSpec.build("plain"),
    ]
    await store.submit(specs)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT key, interval, burst FROM contend.rate_keys ORDER BY key")
        assert await cur.fetchall() == [("k", 4.0, 3), ("other", 0.5, 1)]
