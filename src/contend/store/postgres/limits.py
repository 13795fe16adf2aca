"""Rate limits and fair share on PostgreSQL: the SQL of the fair claim's walk over the heads of
a queue's fair keys, and each rate key's GCRA state in ``rate_keys``. The rules are
``contend.domain.limits``'; this module only reads and writes their state.

A claim that meets neither (no task of its queues has a fair key, none of its picks a limit
key) pays for one probe of the empty ``tasks_fair`` index (:data:`HAS_FAIR`) and nothing
else: a task without a limit key never looks at ``rate_keys``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from contend.domain.limits import FAIR_KEYS, FairCandidate, Rate, fair_order, spend

#: Whether ``%(queues)s`` hold a pending fair task (one probe of ``tasks_fair``); with
#: named tasks, whether one of those is fair.
HAS_FAIR = (
    "EXISTS (SELECT 1 FROM {s}.tasks t WHERE t.state = 'pending' AND t.fair_key IS NOT NULL"
    " AND NOT t.central AND {queue}{named})"
)

#: Whether a task ``t`` with a limit key needs that key's lock to be claimed: it has a
#: concurrency limit, or its key a rate (which holds back every task of the key).
LIMITED = (
    "(t.limit_key IS NOT NULL AND (t.limit_max IS NOT NULL"
    " OR EXISTS (SELECT 1 FROM {s}.rate_keys r WHERE r.key = t.limit_key)))"
)

#: A task ``t`` whose key's rate has no room now (``full_until = tat - (burst - 1) *
#: interval``: one comparison). Read in the statement's snapshot: a hint that keeps throttled
#: keys out of the walk; the room a claim relies on is read under the key's lock.
THROTTLED = (
    "EXISTS (SELECT 1 FROM {s}.rate_keys r WHERE r.key = t.limit_key AND r.full_until > {now})"
)

#: The columns of a candidate of a limited or fair claim (read by :class:`Pick`).
PICK_COLUMNS = (
    "t.id, t.fair_key, t.priority, t.eff_priority, t.run_at, t.limit_key, t.limit_max, " + LIMITED
)


def has_fair(named: bool, queues: int) -> str:
    """:data:`HAS_FAIR` for *queues* distinct queues (one: an equality, a little cheaper to
    run than an array's; claims of plain queues pay this probe and no more)."""
    return HAS_FAIR.format(
        s="{s}",
        queue="t.queue = %(q0)s" if queues == 1 else "t.queue = ANY(%(queues)s)",
        named=" AND t.id = ANY(%(ids)s)" if named else "",
    )


@dataclass(frozen=True, slots=True)
class Pick:
    """A candidate of a limited or fair claim (a row of :data:`PICK_COLUMNS`)."""

    id: str
    fair_key: str | None
    priority: int
    eff_priority: int
    run_at: float
    limit_key: str | None
    limit_max: int | None
    limited: bool

    @classmethod
    def of(cls, row: Sequence[Any]) -> Pick:
        return cls(*row[:8])

    @property
    def best(self) -> tuple[int, float, str]:
        """Its place in claim order (effective priority, due time, id)."""
        return (-self.eff_priority, self.run_at, self.id)


def _next_key(queue: str, after: str) -> str:
    """The first fair key of *queue* after *after* among its pending tasks: one probe of
    ``tasks_fair`` (the skip scan's step)."""
    return (
        "(SELECT t.fair_key FROM {s}.tasks t WHERE t.state = 'pending'"
        " AND t.fair_key IS NOT NULL AND NOT t.central"
        f" AND t.queue = {queue} AND t.fair_key > {after}"
        " ORDER BY t.fair_key LIMIT 1)"
    )


def fair_keys_cte() -> str:
    """CTE ``fkeys``: up to FAIR_KEYS fair keys of each queue of ``%(queues)s``, taken by a
    skip scan of ``tasks_fair`` from just after that queue's ``%(fair_starts)s`` key (where
    the last claim stopped), round to the first key and up to that one again, so that with
    more keys each has its turn. A row's ``c`` counts the keys so far; a row with no key
    ends its queue's walk (the one just after the start marks the turn to the first key)."""
    step = _next_key("f.queue", "coalesce(f.key, '')")
    return (
        "fkeys (queue, start, key, wrapped, c) AS ("
        "  SELECT l.queue, l.start, n.key, false, (n.key IS NOT NULL)::int"
        "  FROM unnest(%(queues)s::text[], %(fair_starts)s::text[]) AS l(queue, start),"
        f"  LATERAL (SELECT {_next_key('l.queue', 'l.start')} AS key) n"
        "  UNION ALL"
        "  SELECT f.queue, f.start, n.key, n.wrapped, f.c + (n.key IS NOT NULL)::int"
        "  FROM fkeys f, LATERAL ("
        "   SELECT CASE WHEN w.wrapped AND w.key > f.start THEN NULL ELSE w.key END AS key,"
        "    w.wrapped"
        f"   FROM (SELECT {step} AS key,"
        "    f.wrapped OR f.key IS NULL AS wrapped) w) n"
        f"  WHERE f.c < {FAIR_KEYS}"
        "   AND (f.key IS NOT NULL OR (NOT f.wrapped AND f.start <> '')))"
    )


def fair_sql(where: str, *, queues: int, named: bool, lane: bool, lock: bool) -> tuple[str, str]:
    """The CTEs and the query of a fair pick: rows ``(src, *PICK_COLUMNS)``, *src* being
    ``lane`` (the ``lane`` CTE's picks, which the caller puts first), ``head`` (up to
    ``%(want)s`` claimable tasks of each key of ``fkeys``, in claim order per key), ``plain``
    (the tasks without a fair key among each queue's best ``%(want)s + 64``, so that a long
    fair backlog costs no scan) or ``cursor`` (a queue whose walk stopped at FAIR_KEYS, and
    the key it stopped at: ``limit_key``, ``fair_key``). *where* is the claimable condition
    on ``t``. Named tasks (*named*) are few and read by primary key: each is a head.
    With *lock*, the candidates are taken ``FOR UPDATE SKIP LOCKED``."""
    tail = " FOR UPDATE SKIP LOCKED" if lock else ""
    if lane:
        where += " AND t.id <> ALL(ARRAY(SELECT id FROM lane))"
    ctes: list[str] = []
    arms = []
    if lane:
        arms.append(f"SELECT 'lane', {PICK_COLUMNS} FROM lane JOIN {{s}}.tasks t USING (id)")
    if named:
        ctes.append(
            f"fair_heads AS (SELECT {PICK_COLUMNS} FROM {{s}}.tasks t"
            f" WHERE {where} AND t.queue = ANY(%(queues)s){tail})"
        )
        arms.append("SELECT 'head', * FROM fair_heads")
        return ", ".join(ctes), " UNION ALL ".join(arms)
    ctes.append(fair_keys_cte())
    ctes.append(
        "fair_heads AS (SELECT h.* FROM fkeys f CROSS JOIN LATERAL ("
        f"  SELECT {PICK_COLUMNS} FROM {{s}}.tasks t"
        f"  WHERE {where} AND t.queue = f.queue AND t.fair_key = f.key"
        f"  ORDER BY t.eff_priority DESC, t.run_at, t.id LIMIT %(want)s{tail}) h"
        "  WHERE f.key IS NOT NULL)"
    )
    arms.append("SELECT 'head', * FROM fair_heads")
    for n in range(queues):
        # locked once chosen among the best, so that the fair tasks among those stay free
        ctes.append(
            f"plain_{n} AS (SELECT {PICK_COLUMNS} FROM {{s}}.tasks t WHERE t.id IN ("
            "  SELECT p.id FROM (SELECT t.id, t.fair_key FROM {s}.tasks t"
            f"   WHERE {where} AND t.queue = %(q{n})s"
            "   ORDER BY t.eff_priority DESC, t.run_at, t.id LIMIT %(want)s + 64) p"
            f"  WHERE p.fair_key IS NULL) AND t.state = 'pending'{tail})"
        )
        arms.append(f"SELECT 'plain', * FROM plain_{n}")
    arms.append(
        "SELECT 'cursor', NULL, f.key, NULL, NULL, NULL, f.queue, NULL, NULL FROM fkeys f"
        f" WHERE f.c = {FAIR_KEYS} AND f.key IS NOT NULL"
    )
    return ", ".join(ctes), " UNION ALL ".join(arms)


def fair_params(queues: Sequence[str], cursor: dict[str, str], want: int) -> dict[str, Any]:
    distinct = list(dict.fromkeys(queues))
    return {
        "fair_starts": [cursor.get(q, "") for q in distinct],
        "want": want,
    }


def fair_picks(
    rows: Iterable[Sequence[Any]], cursor: dict[str, str] | None, queues: Sequence[str]
) -> tuple[list[Pick], list[Pick]]:
    """The lane's picks (in their order) and the other candidates of a fair pick's *rows*;
    *cursor* (queue -> the key its next walk starts after), unless None, is moved on."""
    lane: list[Pick] = []
    rest: list[Pick] = []
    stopped: dict[str, str] = {}
    for r in rows:
        if r[0] == "cursor":
            stopped[r[6]] = r[2]
        else:
            (lane if r[0] == "lane" else rest).append(Pick.of(r[1:]))
    if cursor is not None:
        cursor.update((q, stopped.get(q, "")) for q in dict.fromkeys(queues))
    lane.sort(key=lambda p: (p.run_at, p.id))
    return lane, rest


def in_fair_order(candidates: list[Pick], running: dict[str, int]) -> list[Pick]:
    """*candidates* in fair order (``contend.domain.limits.fair_order``), given each fair
    key's claimed and running tasks (*running*)."""
    candidates = sorted(candidates, key=lambda p: p.best)  # each key's in claim order
    heads = (
        FairCandidate(p.id, p.fair_key, p.priority, p.eff_priority, p.run_at) for p in candidates
    )
    by_id = {p.id: p for p in candidates}
    return [by_id[i] for i in fair_order(heads, running, len(candidates))]


#: Each of ``%(keys)s``: its claimed and running tasks, and its rate and state (NULL: none),
#: with the time they were read. Run after the keys' locks, it is what the claim relies on.
KEY_STATES = (
    "SELECT k.key, (SELECT count(*) FROM {s}.tasks h WHERE h.limit_key = k.key"
    "  AND h.state IN ('claimed', 'running')), r.interval, r.burst, r.tat, {now}"
    " FROM unnest(%(keys)s::text[]) AS k(key) LEFT JOIN {s}.rate_keys r ON r.key = k.key"
)

RateStates = dict[str, tuple[Rate, float | None]]


def key_states(rows: Iterable[Sequence[Any]]) -> tuple[dict[str, int], RateStates, float]:
    """:data:`KEY_STATES`' rows: held tasks per key, rate states, and the time read."""
    held: dict[str, int] = {}
    rates: RateStates = {}
    now = 0.0
    for key, n, interval, burst, tat, at in rows:
        held[key] = int(n)
        if interval is not None:
            rates[key] = (Rate(float(interval), int(burst)), tat)
        now = float(at)
    return held, rates, now


#: CTE ``spent``: the rate keys of the tasks a claim took, each moved on by one start a task.
SPEND = (
    "spent AS (UPDATE {s}.rate_keys r SET tat = m.tat,"
    "  full_until = m.tat - (r.burst - 1) * r.interval"
    "  FROM unnest(%(spent_keys)s::text[], %(spent_tats)s::float8[]) AS m(key, tat)"
    "  WHERE r.key = m.key)"
)


def spend_params(rates: RateStates, taken: Iterable[str | None], now: float) -> dict[str, Any]:
    moved = spend(taken, rates, now)
    return {"spent_keys": list(moved), "spent_tats": list(moved.values())}
