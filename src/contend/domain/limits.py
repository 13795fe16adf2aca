"""Concurrency limits: at most K tasks of one limit key claimed or running at once, across all
experts and hosts (Hatchet's concurrency keys; celery#5732 asks the same of rate limits).

A task carries its key and its K from its submission (``TaskSpec.limit_key``,
``TaskSpec.concurrency_limit``); a store admits a claimable task only while the tasks of its
key that are claimed or running, plus those the same claim already took, number fewer than
the task's K. :func:`admit` is that rule, for the stores that pick in code; the SQL stores
apply it inside their claim's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from contend.domain.payload import check_name
from contend.errors import TaskError, shown

#: The largest concurrency limit.
MAX_CONCURRENCY_LIMIT = 1_000_000
#: The longest limit key, characters.
MAX_LIMIT_KEY_CHARS = 200


def check_concurrency_limit(key: str | None, limit: int | None) -> tuple[str | None, int | None]:
    """A task's limit key and limit, checked: both or neither."""
    if key is None and limit is None:
        return None, None
    if key is None or limit is None:
        raise TaskError("a concurrency limit needs both a limit key and a limit")
    check_name(key, "limit key", MAX_LIMIT_KEY_CHARS)
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= MAX_CONCURRENCY_LIMIT
    ):
        raise TaskError(
            f"a concurrency limit must be a whole number from 1 to {MAX_CONCURRENCY_LIMIT:,}, "
            f"got {shown(limit)}"
        )
    return key, limit


def admit(
    candidates: Iterable[tuple[str, str | None, int | None]],
    held: Mapping[str, int],
    want: int,
) -> list[str]:
    """Of *candidates* (id, limit key, limit), in claim order, the first *want* that their
    keys admit, given *held* (limit key -> tasks of it claimed or running now)."""
    taken: dict[str, int] = {}
    out: list[str] = []
    for tid, key, limit in candidates:
        if len(out) >= want:
            break
        if key is not None and limit is not None:
            n = held.get(key, 0) + taken.get(key, 0)
            if n >= limit:
                continue
            taken[key] = taken.get(key, 0) + 1
        out.append(tid)
    return out
