"""A task for the dashboard's tests, on any store: one that failed its only attempt, which
the dashboard offers to retry."""

from __future__ import annotations

from contend.domain.task import TaskSpec
from contend.store.port import ExpertInfo, Failure, Store


async def dead_task(store: Store) -> str:
    """Submit a task, claim it and fail it for good; its id. The expert that ran it leaves."""
    spec = TaskSpec.build("job", [1], max_attempts=1)
    await store.submit([spec])
    session = await store.register_expert(ExpertInfo("e1"), 15.0)
    (c,) = await store.claim(
        "e1", session, ["default"], ExpertInfo("e1").capabilities, limit=1, lease_ttl=15.0
    )
    await store.fail("e1", [Failure(c.id, c.fence, '{"type": "Boom", "message": "no"}', None)])
    await store.deregister_expert("e1", session)
    return spec.id
