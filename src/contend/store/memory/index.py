"""The memory store's indexes: where each task can be found without a scan of them all.

* Pending tasks, per queue and per task type and set of requirements, each group sorted by
  (-effective priority, run_at, id), so choosing what to claim costs about O(log n) per task
  returned.
* Held (claimed or running) tasks, in claim order, for ``renew`` and ``expire``.
* The ageing schedule: a heap of (promote_at, id), so ``expire`` raises only the tasks whose
  next step is due.

:meth:`TaskIndex.place` re-files a row after its state or run_at changed; the store calls it
on every change of state.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from contend.domain.task import (
    LANE_LEVELS,
    Capabilities,
    Requirements,
    TaskState,
    aged_priority,
    next_promotion,
)
from contend.store._sorted import SortedKeys
from contend.store.memory.records import Key, Row

P, C, R = TaskState.PENDING, TaskState.CLAIMED, TaskState.RUNNING

#: Requirements made hashable: (tags, resources).
ReqKey = tuple[frozenset[str], tuple[tuple[str, float], ...]]
#: What the pending tasks of one group share: their type and their requirements.
GroupKey = tuple[str, ReqKey]


def req_key(req: Requirements) -> ReqKey:
    return req.tags, tuple(sorted(req.resources.items()))


def group_key(row: Row) -> GroupKey:
    return row.spec.type, req_key(row.spec.requirements)


@dataclass(slots=True)
class Group:
    """The pending tasks of one queue that share a type and a set of requirements, best
    first."""

    type: str
    requirements: Requirements
    keys: SortedKeys[Key] = field(default_factory=SortedKeys[Key])

    def due(self, now: float) -> Iterator[Key]:
        """Keys of tasks due by *now*, in claim order. Within a priority level tasks sort by
        run_at, so the first one not yet due ends the level: jump to the next one."""
        start: Key | None = None
        while True:
            for key in self.keys.iter_from(start):
                if key[1] > now:
                    start = (key[0], math.inf, "")
                    break
                yield key
            else:
                return

    def earliest(self) -> float | None:
        """The smallest run_at: the first key of each priority level."""
        best: float | None = None
        start: Key | None = None
        while (key := self.keys.first_from(start)) is not None:
            best = key[1] if best is None else min(best, key[1])
            start = (key[0], math.inf, "")
        return best


class TaskIndex:
    """The pending groups, the held tasks and the ageing schedule of one store."""

    __slots__ = ("_groups", "_promotions", "central", "held", "levels")

    def __init__(self) -> None:
        self._groups: dict[str, dict[GroupKey, Group]] = {}  # queue -> (type, reqs) -> pending
        self._promotions: list[tuple[float, str]] = []  # (promote_at, id), a heap for ageing
        self.levels = False  # a priority other than 0 was submitted: pending tasks age
        #: Ids of claimed or running tasks, in claim order.
        self.held: dict[str, None] = {}
        #: Pending central tasks, per queue: out of the claim order's groups, so that a
        #: central backlog costs a compete claim nothing (``contend.domain.dispatch``).
        self.central: dict[str, dict[str, None]] = {}

    def place(self, tid: str, row: Row) -> None:
        """File *row* under its current state: call it after changing its state or run_at."""
        if row.key is not None:
            group = self._groups[row.spec.queue][group_key(row)]
            group.keys.discard(row.key)
            row.key = None
        state = row.state
        if row.spec.central:
            self._place_central(tid, row)
        elif state == P:
            row.key = (-row.aged, row.run_at, tid)
            if self.levels:
                heapq.heappush(self._promotions, (row.promote_at, tid))
            groups = self._groups.setdefault(row.spec.queue, {})
            gk = group_key(row)
            found = groups.get(gk)
            if found is None:
                found = groups[gk] = Group(row.spec.type, row.spec.requirements)
            found.keys.add(row.key)
        if state in (C, R):
            self.held[tid] = None
        else:
            self.held.pop(tid, None)

    def _place_central(self, tid: str, row: Row) -> None:
        pending = self.central.setdefault(row.spec.queue, {})
        if row.state == P:
            pending[tid] = None
            if self.levels:
                heapq.heappush(self._promotions, (row.promote_at, tid))
        else:
            pending.pop(tid, None)
            row.assignee = None  # an assignment is used up by the claim, or by the end

    def use_levels(self, tasks: Mapping[str, Row]) -> None:
        """A task of a priority other than 0 came: from now on pending tasks age (before, it
        could not change their order: ``domain.task.AGEING``), those waiting now
        from their due time at the next :meth:`age`."""
        if self.levels:
            return
        self.levels = True
        for tid, row in tasks.items():
            if row.state == P:
                heapq.heappush(self._promotions, (row.promote_at, tid))

    def age(self, now: float, tasks: Mapping[str, Row]) -> None:
        """Ageing: pending tasks whose next step is due gain it (and move in the index)."""
        heap = self._promotions
        while heap and heap[0][0] <= now:
            at, tid = heapq.heappop(heap)
            row = tasks.get(tid)
            if row is None or row.state != P or row.promote_at != at:
                continue  # stale entry: the task left pending, or moved already
            row.aged = aged_priority(row.spec.priority, now - row.run_at)
            row.promote_at = next_promotion(row.spec.priority, row.aged, row.run_at)
            self.place(tid, row)  # re-files it under its new key, queues the next step

    def _runnable(
        self, queues: Sequence[str], caps: Capabilities, types: Collection[str] | None
    ) -> list[Group]:
        """The non-empty groups of *queues* whose requirements *caps* satisfy, of *types*
        (None: of any type)."""
        kinds = None if types is None else set(types)
        return [
            group
            for q in dict.fromkeys(queues)
            for group in self._groups.get(q, {}).values()
            if group.keys
            and (kinds is None or group.type in kinds)
            and caps.satisfies(group.requirements)
        ]

    def claimable(
        self,
        queues: Sequence[str],
        caps: Capabilities,
        now: float,
        limit: int,
        low_lane: int = 0,
        types: Collection[str] | None = None,
        *,
        ids: Collection[str] | None = None,
        tasks: Mapping[str, Row] | None = None,
        without: Collection[str] = (),
        order: Callable[[list[str]], list[str]] | None = None,
    ) -> list[str]:
        """Up to *limit* ids of due pending tasks *caps* can run, of *types* (None: any) and
        among *ids* (None: any) and not in *without*: best first by (−effective priority,
        run_at, id), except that up to *low_lane* of them are the low lane's (the due longest
        below the top base priority: Store.claim; that part scans every due task, and needs
        *tasks*). *order*, given, reorders the best (fair share) and puts the lane's first, so
        that a caller who admits only some (limits) still gives the lane its share."""
        groups = self._runnable(queues, caps, types)
        if limit <= 0 or not groups:
            return []
        streams = [group.due(now) for group in groups]
        merged: Iterator[Key] = streams[0] if len(streams) == 1 else heapq.merge(*streams)
        if ids is not None:
            merged = (key for key in merged if key[2] in ids)
        if without:
            merged = (key for key in merged if key[2] not in without)
        if order is not None:
            everything = list(merged)
            lane = _lane(everything, tasks, min(low_lane, limit)) if low_lane and tasks else set()
            rest = order([key[2] for key in everything if key not in lane])
            return [*(key[2] for key in sorted(lane)), *rest][:limit]
        if not low_lane or tasks is None:
            return [key[2] for _, key in zip(range(limit), merged, strict=False)]
        everything = list(merged)
        lane = _lane(everything, tasks, min(low_lane, limit))
        best = [key for key in everything if key not in lane][: limit - len(lane)]
        return [key[2] for key in sorted([*best, *lane])]

    def next_due(self, queues: Sequence[str]) -> float | None:
        """The earliest run_at of any pending task of *queues*, due or not."""
        due = [
            t
            for q in dict.fromkeys(queues)
            for group in self._groups.get(q, {}).values()
            if (t := group.earliest()) is not None
        ]
        return min(due) if due else None


def _lane(keys: Sequence[Key], tasks: Mapping[str, Row], n: int) -> set[Key]:
    """The low lane's *n* of *keys*: due the longest among those below the top base priority,
    of the top LANE_LEVELS levels below it in each queue."""
    base = {key: tasks[key[2]].spec for key in keys}
    if not base:
        return set()
    top = max(spec.priority for spec in base.values())
    levels: dict[str, set[int]] = {}
    for spec in base.values():
        if spec.priority < top:
            levels.setdefault(spec.queue, set()).add(spec.priority)
    kept = {q: set(sorted(ps, reverse=True)[:LANE_LEVELS]) for q, ps in levels.items()}
    lower = [k for k, spec in base.items() if spec.priority in kept.get(spec.queue, ())]
    return set(heapq.nsmallest(n, lower, key=lambda k: (k[1], k[2])))
