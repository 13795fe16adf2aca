"""Small helpers shared by the contract tests: an expert handle, owner writes by name, the
states by letter, and moving the clock while experts keep their leases."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.errors import FencedOut
from contend.store.port import (
    Claimed,
    Completion,
    ExpertInfo,
    Failure,
    Heartbeat,
    Store,
)
from contend.testing.contract.harness import Harness

OWNER_WRITES = ("start", "checkpoint", "progress", "complete", "fail", "release")


def spec(type: str = "job", *args: Any, **options: Any) -> TaskSpec:
    return TaskSpec.build(type, list(args), **options)


def caps(*tags: str, **resources: float) -> Capabilities:
    return Capabilities(frozenset(tags), dict(resources))


@dataclass
class Expert:
    """One registered expert session on one store instance."""

    store: Store
    name: str
    session: str
    ttl: float
    capabilities: Capabilities

    @classmethod
    async def join(
        cls,
        store: Store,
        name: str,
        ttl: float,
        capabilities: Capabilities | None = None,
    ) -> Expert:
        capabilities = capabilities or Capabilities()
        info = ExpertInfo(id=name, capabilities=capabilities, queues=("default",))
        session = await store.register_expert(info, ttl)
        return cls(store, name, session, ttl, capabilities)

    async def claim(
        self,
        limit: int = 1,
        *,
        queues: Sequence[str] = ("default",),
        task_ids: Sequence[str] | None = None,
        start: bool = True,
        types: Sequence[str] | None = None,
    ) -> list[Claimed]:
        return await self.store.claim(
            self.name,
            self.session,
            queues,
            self.capabilities,
            limit=limit,
            lease_ttl=self.ttl,
            task_ids=task_ids,
            start=start,
            types=types,
        )

    async def claim_one(self, **kw: Any) -> Claimed:
        got = await self.claim(1, **kw)
        assert len(got) == 1, f"{self.name} expected to claim one task, got {got}"
        return got[0]

    async def renew(self) -> dict[str, int]:
        return await self.store.renew(self.name, self.session, self.ttl, Heartbeat())

    async def write(self, op: str, task_id: str, fence: int, **kw: Any) -> FencedOut | None:
        """Do owner write *op*; return None when it landed, the FencedOut when refused."""
        return await owner_write(self.store, op, self.name, task_id, fence, **kw)


async def owner_write(
    store: Store,
    op: str,
    expert: str,
    task_id: str,
    fence: int,
    *,
    result: Any = "ok",
    retry_delay: float | None = None,
    final_state: TaskState = TaskState.DEAD,
    state: Any = None,
) -> FencedOut | None:
    if op == "start":
        (out,) = await store.start(expert, [(task_id, fence)])
    elif op == "checkpoint":
        try:
            await store.checkpoint(expert, task_id, fence, json.dumps(state or {"step": 1}))
        except FencedOut as exc:
            return exc
        return None
    elif op == "progress":
        try:
            text = json.dumps({"done": (state or {}).get("done", 1), "total": 10, "note": None})
            await store.progress(expert, task_id, fence, text)
        except FencedOut as exc:
            return exc
        return None
    elif op == "complete":
        (out,) = await store.complete(expert, [Completion(task_id, fence, json.dumps(result))])
    elif op == "fail":
        error = json.dumps({"type": "Boom", "message": "boom"})
        (out,) = await store.fail(
            expert, [Failure(task_id, fence, error, retry_delay, final_state)]
        )
    elif op == "release":
        (out,) = await store.release(expert, [(task_id, fence)])
    else:  # pragma: no cover - a typo in a test
        raise AssertionError(f"unknown owner write {op!r}")
    return out


async def snapshot(store: Store) -> list[dict[str, Any]]:
    """Everything observable about every task, to show that a refused call changed nothing."""
    return [t.to_json() for t in await store.list_tasks(limit=10_000)]


P, W, C, R = TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING
OK, FAILED, DEAD, CANCELLED = (
    TaskState.SUCCEEDED,
    TaskState.FAILED,
    TaskState.DEAD,
    TaskState.CANCELLED,
)


async def join(
    h: Harness,
    name: str = "e1",
    store: Store | None = None,
    capabilities: Capabilities | None = None,
) -> Expert:
    return await Expert.join(store or h.store, name, h.ttl, capabilities)


async def state_of(store: Store, task_id: str) -> TaskState:
    return (await store.get(task_id)).state


async def pass_time(h: Harness, seconds: float, *experts: Expert) -> None:
    """Move the clock by *seconds* in steps short enough for *experts* to keep their leases."""
    step = h.ttl / 2
    while seconds > 0:
        await h.advance(min(step, seconds))
        seconds -= step
        for e in experts:
            await e.renew()
