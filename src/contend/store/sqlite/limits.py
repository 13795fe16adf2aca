"""Rate limits and fair share on SQLite: each rate key's GCRA state in ``rate_keys``, and the
fair claim's walk over the heads of a queue's limit keys (``tasks_fair``). The rules are
``contend.domain.limits``'; this module only reads and writes their state."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from contend.domain.limits import FAIR_KEYS, FairCandidate, Rate, spend

RateStates = dict[str, tuple[Rate, float | None]]


def throttled(conn: sqlite3.Connection, now: float) -> list[str]:
    """The rate keys with no room at *now* (``full_until = tat - (burst - 1) * interval``, so
    one range of an index finds them, however many keys there are)."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT key FROM rate_keys INDEXED BY rate_keys_full WHERE full_until > ?", (now,)
        )
    ]


def rate_states(conn: sqlite3.Connection, keys: Collection[str | None]) -> RateStates:
    """Rate key -> (its rate, its tat), for those of *keys* that have a rate."""
    wanted = [k for k in set(keys) if k is not None]
    if not wanted:
        return {}
    marks = ",".join("?" * len(wanted))
    return {
        key: (Rate(interval, burst), tat)
        for key, interval, burst, tat in conn.execute(
            f"SELECT key, interval, burst, tat FROM rate_keys WHERE key IN ({marks})", wanted
        )
    }


def spend_rates(
    conn: sqlite3.Connection, rates: RateStates, claimed: Iterable[str | None], now: float
) -> None:
    """Move the rate keys of the tasks just claimed on by one start each."""
    moved = spend(claimed, rates, now)
    conn.executemany(
        "UPDATE rate_keys SET tat = ?, full_until = ? - (burst - 1) * interval WHERE key = ?",
        [(tat, tat, key) for key, tat in moved.items()],
    )


def has_fair(conn: sqlite3.Connection, queues: Sequence[str]) -> bool:
    """Whether any of *queues* has a pending fair task (a seek per queue)."""
    marks = ",".join("?" * len(queues))
    return (
        conn.execute(
            f"SELECT 1 FROM tasks INDEXED BY tasks_fair WHERE state = 'pending' "
            f"AND fair_key IS NOT NULL AND queue IN ({marks}) LIMIT 1",
            tuple(queues),
        ).fetchone()
        is not None
    )


def fair_heads(
    conn: sqlite3.Connection,
    queue: str,
    where: str,
    params: Sequence[Any],
    want: int,
    cursor: dict[str, str],
) -> list[FairCandidate]:
    """Up to *want* claimable tasks (*where*, with its *params* after the queue) of each of up
    to FAIR_KEYS fair keys of *queue*, in claim order per key. The keys are taken by a skip
    scan of ``tasks_fair`` (one recursive statement) from where the last claim of this
    connection stopped (*cursor*), wrapping round, so that with more keys than that each has
    its turn; their heads come in one more statement."""
    start = cursor.get(queue, "")
    keys = _fair_keys(conn, queue, start, FAIR_KEYS)
    if len(keys) < FAIR_KEYS and start:  # round to the first key, up to where we began
        keys += [k for k in _fair_keys(conn, queue, "", FAIR_KEYS - len(keys)) if k <= start]
    cursor[queue] = keys[-1] if len(keys) >= FAIR_KEYS else ""
    if not keys:
        return []
    one = (
        f"SELECT * FROM (SELECT id, fair_key, priority, eff_priority, run_at FROM tasks "
        f"INDEXED BY tasks_fair WHERE fair_key = ? AND {where} "
        "ORDER BY eff_priority DESC, run_at, id LIMIT ?)"
    )
    args = [a for key in keys for a in (key, queue, *params, want)]
    return [
        FairCandidate(r[0], r[1], r[2], r[3], r[4])
        for r in conn.execute(" UNION ALL ".join([one] * len(keys)), args)
    ]


def _fair_keys(conn: sqlite3.Connection, queue: str, after: str, most: int) -> list[str]:
    """Up to *most* fair keys of *queue*'s pending tasks after *after*, in order: a skip scan
    of ``tasks_fair``, one seek a key."""
    return [
        r[0]
        for r in conn.execute(
            "WITH RECURSIVE k(key, n) AS (SELECT ?, 0 UNION ALL SELECT (SELECT fair_key "
            "FROM tasks INDEXED BY tasks_fair WHERE state = 'pending' AND fair_key IS NOT NULL "
            "AND queue = ? AND fair_key > k.key ORDER BY fair_key LIMIT 1), n + 1 FROM k "
            "WHERE k.key IS NOT NULL AND n < ?) SELECT key FROM k WHERE n > 0 AND key IS NOT NULL",
            (after, queue, most),
        )
    ]
