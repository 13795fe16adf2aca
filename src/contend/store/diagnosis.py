"""Why pending tasks are not running, read through the Store port alone (so it works with
every backend): the rule is :func:`contend.domain.blocking.why_not_running`; this module only
gathers its facts from the store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contend.domain.blocking import (
    Blocker,
    Diagnosis,
    ExpertFacts,
    PendingFacts,
    count_blockers,
    why_not_running,
)
from contend.domain.limits import KeyState
from contend.domain.task import Task, TaskState
from contend.store.port import ExpertRecord, Store

#: How many pending tasks (the oldest first) :func:`blocked_counts` looks at.
SAMPLE = 5000


def expert_facts(record: ExpertRecord) -> ExpertFacts:
    info = record.info
    return ExpertFacts(
        name=info.id,
        alive=record.alive,
        queues=frozenset(info.queues),
        capabilities=info.capabilities,
        task_types=frozenset(info.task_types),
        load=record.load,
        capacity=info.capacity,
        tier=info.tier,
        active=bool(record.metrics.get("active", False)),
    )


def pending_facts(task: Task) -> PendingFacts:
    return PendingFacts(
        id=task.id,
        type=task.type,
        queue=task.queue,
        state=task.state,
        run_at=task.run_at,
        requirements=task.requirements,
        attempts=task.attempts,
        depends_on=task.depends_on,
        limit_key=task.limit_key,
        concurrency_limit=task.concurrency_limit,
    )


def explain(
    task: Task,
    now: float,
    experts: Sequence[ExpertRecord],
    keys: Mapping[str, KeyState] | None = None,
) -> Diagnosis | None:
    """Why *task* is not running, given the store's time, experts and key states read."""
    return why_not_running(pending_facts(task), now, [expert_facts(e) for e in experts], keys)


async def diagnose(store: Store, task: Task) -> Diagnosis | None:
    """Why *task* is not running, as *store* sees it now; None when it runs or has ended."""
    if task.state not in (TaskState.PENDING, TaskState.WAITING):
        return None
    keys = await store.key_states([task.limit_key]) if task.limit_key is not None else {}
    return explain(task, await store.now(), await store.list_experts(), keys)


@dataclass(frozen=True, slots=True)
class BlockedCounts:
    """Pending and waiting tasks by (queue, reason). ``complete`` is False when there were
    more pending tasks than :data:`SAMPLE`: the counts then cover the oldest ones (waiting
    tasks are always counted whole, from the store's counts)."""

    counts: dict[tuple[str, Blocker], int]
    complete: bool


async def blocked_counts(
    store: Store,
    *,
    sample: int = SAMPLE,
    counts: dict[str, dict[str, int]] | None = None,
    experts: Sequence[ExpertRecord] | None = None,
) -> BlockedCounts:
    """Count the reasons that hold pending and waiting tasks back. *counts* (queue → state →
    n) and *experts*, when the caller has read them already, save two reads."""
    if counts is None or experts is None:
        stats = await store.stats()
        counts, experts = stats.counts, stats.experts
    now = await store.now()
    pending = await store.list_tasks(state=TaskState.PENDING, limit=sample)
    facts = [expert_facts(e) for e in experts]
    keys = await store.key_states({t.limit_key for t in pending if t.limit_key is not None})
    found = count_blockers((pending_facts(t) for t in pending), now, facts, keys)
    for queue, states in counts.items():
        waiting = states.get(str(TaskState.WAITING), 0)
        if waiting:
            found[(queue, Blocker.WAITING_ON_DEPENDENCIES)] = waiting
    total_pending = sum(s.get(str(TaskState.PENDING), 0) for s in counts.values())
    return BlockedCounts(found, complete=len(pending) < sample or total_pending <= sample)
