"""Where a claim's walk of a queue may start: past the index entries of tasks claimed since.

A claim walks ``tasks_claimable`` in claim order. Every task claimed leaves an entry there for
its pending row version, and while a transaction elsewhere holds vacuum back (an idle ``psql``
session, a long report, ``pg_dump``) those entries cannot be removed, nor even marked dead in
the index: each walk fetches the heap row of every one of them before it reaches a pending
task. Claims then cost more with every task done: 9 ms for a claim of 8 behind 40,000 of
them (``benchmarks/pg_dead_rows.py``), and an expert at 1,000 tasks/s fell minutes behind.

So a claim remembers, for each queue and each claim shape (capabilities and task types: what
its walk passes over), the first task it took: the top priority level it took from and that
task's (run_at, id). Everything its walk passed before that task was a row version it could not
see, a task a rival's claim held locked, or one it cannot take. The next claim seeks that level
from there (:func:`arm`), and walks the levels above and below as before (a flood of one level
leaves no entries in the others).

A task can come back below a floor: one released or given back, one whose lease lapsed, one
whose dependencies are over, one retried by hand or promoted by ageing, one a rival's claim held
and rolled back. A claim without floors finds it. Each write that may do so notifies the
listeners with :data:`~.database.LOWERED`, and their next claims walk whole; besides, a claim
walks whole whenever the last one that did is 100 times its cost ago, at most
:data:`FULL_EVERY` apart (:data:`FULL_EVERY_UNHEARD` while notices are not heard). Floors
are used only while a whole walk costs more than 2 ms: without a transaction holding vacuum
back, never.

The 10-minute sustained run (1,000 tasks/s on PostgreSQL, vacuum held back for 5 minutes)
with whole walks every 20 times their cost and at least once a second: those walks grew with
the held-back rows, to 40 % of the claims' server time, and pickup p50 rose from 18 to 135 ms
over 150 s of the hold.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Hashable, Sequence
from typing import Any

from contend.domain.task import Capabilities

#: A claim without floors is made when the last one is this many times its cost ago...
FULL_SHARE = 100
#: ...and at least this often, seconds, while the store's notices are heard (each write that
#: may leave a task below a floor says so, ``Database.notify``, and the next claim walks
#: whole): a floor then misses only a task a rival's claim held and then rolled back...
FULL_EVERY = 10.0
#: ...and this often while they are not (``?listen=off``, or its connection is down).
FULL_EVERY_UNHEARD = 1.0
#: Claims slower than this, seconds, make floors worth using (a fast walk is exact and cheap).
WORTH = 0.002

Floor = tuple[int, float, str]  # eff_priority, run_at, id


class Shape:
    """The floors of one claim shape: one per queue, and when a full walk was last made."""

    __slots__ = ("floors", "full_at", "full_cost")

    def __init__(self) -> None:
        self.floors: dict[str, Floor] = {}
        self.full_at = -float("inf")
        self.full_cost = 0.0

    def use(self, now: float, heard: bool = True) -> bool:
        """Whether this claim may start at the floors; *heard*: the store's notices are."""
        if not self.floors or self.full_cost < WORTH:
            return False
        most = FULL_EVERY if heard else FULL_EVERY_UNHEARD
        return now - self.full_at < min(most, FULL_SHARE * self.full_cost)

    def learn(self, rows: Sequence[Sequence[Any]], full: bool, began: float, now: float) -> None:
        """Take the floors from a claim's *rows* (queue, eff_priority, run_at, id at the
        indexes of :data:`~.rows.CLAIMED_COLUMNS`), in claim order. A queue it took nothing
        from keeps its floor: nothing claimable stood above it then either."""
        if full:
            self.full_at, self.full_cost = now, now - began
        seen: set[str] = set()
        for r in rows:
            queue = r[2]
            if queue not in seen:
                seen.add(queue)
                self.floors[queue] = (r[13], r[12], r[0])


def key(
    queues: Sequence[str], capabilities: Capabilities, types: Collection[str] | None
) -> Hashable:
    return (
        tuple(queues),
        capabilities.tags,
        tuple(sorted(capabilities.resources.items())),
        None if types is None else tuple(types),
    )


def params(floors: dict[str, Floor], queues: Sequence[str]) -> dict[str, object]:
    """The floor of each queue ``q{n}`` as ``fl{n}``, ``fr{n}``, ``fi{n}``; a queue without a
    floor gets one below every task of the top level (nothing is skipped)."""
    out: dict[str, object] = {}
    for n, q in enumerate(queues):
        level, run_at, tid = floors.get(q, (2**31 - 1, -float("inf"), ""))
        out |= {f"fl{n}": level, f"fr{n}": run_at, f"fi{n}": tid}
    return out


def arms(n: int, columns: str, where: str, limit: str, tail: str) -> list[str]:
    """CTEs ending in ``best_{n}``: the claim's pick from queue ``q{n}`` in claim order, the
    floor's level sought from the floor. Three walks of ``tasks_claimable``, one CTE each
    (a locking clause may not stand in a UNION): a CTE is read only as far as the query
    asks, so the Append under the Limit starts a walk only when the ones before left the
    limit short."""

    def walk(name: str, level: str) -> str:
        return (
            f"{name}_{n} AS (SELECT {columns} FROM {{s}}.tasks t WHERE {where}"
            f" AND t.queue = %(q{n})s AND {level}"
            f" ORDER BY eff_priority DESC, run_at, id LIMIT {limit}{tail})"
        )

    return [
        walk("above", f"t.eff_priority > %(fl{n})s"),
        walk("at", f"t.eff_priority = %(fl{n})s AND (t.run_at, t.id) >= (%(fr{n})s, %(fi{n})s)"),
        walk("below", f"t.eff_priority < %(fl{n})s"),
        f"best_{n} AS (SELECT * FROM above_{n} UNION ALL SELECT * FROM at_{n}"
        f" UNION ALL SELECT * FROM below_{n} LIMIT {limit})",
    ]


def clock() -> float:
    return time.monotonic()
