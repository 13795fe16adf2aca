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
    scan of ``tasks_fair`` from where the last claim of this connection stopped (*cursor*),
    wrapping round, so that with more keys than that each has its turn."""
    step = (
        "SELECT fair_key FROM tasks INDEXED BY tasks_fair WHERE state = 'pending' "
        "AND fair_key IS NOT NULL AND queue = ? AND fair_key > ? ORDER BY fair_key LIMIT 1"
    )
    pick = (
        f"SELECT id, fair_key, priority, eff_priority, run_at FROM tasks INDEXED BY tasks_fair "
        f"WHERE fair_key = ? AND {where} ORDER BY eff_priority DESC, run_at, id LIMIT ?"
    )
    start = cursor.get(queue, "")
    after, wrapped, seen = start, False, 0
    heads: list[FairCandidate] = []
    while seen < FAIR_KEYS:
        row = conn.execute(step, (queue, after)).fetchone()
        if row is None or (wrapped and row[0] > start):
            if wrapped or not start:
                break
            after, wrapped = "", True  # round to the first key, up to where we began
            continue
        after = row[0]
        seen += 1
        heads += (
            FairCandidate(r[0], r[1], r[2], r[3], r[4])
            for r in conn.execute(pick, (after, queue, *params, want))
        )
    cursor[queue] = after if seen >= FAIR_KEYS else ""
    return heads
