"""The auction's order (seed 000 §2.1), the one rule every store enforces at claim time.

The first bid on a pending task opens its auction for a window and fixes its grace; bids are
ranked best first (higher score, then earlier bid, then name). Nobody may claim the task before
the close; then the bidder ranked *r* (0-based) may from ``closes_at + r × grace``, and anyone
else from ``closes_at + len(bids) × grace``, so a vanished winner never strands the task. A bid
placed after the close is not ranked: the order is sealed when the window ends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from contend.errors import ConfigError

#: Seconds each ranked bidder has to claim before the next may (an auction's default).
DEFAULT_GRACE = 0.5
#: The longest grace a bid may set, seconds.
MAX_GRACE = 600.0


def check_grace(grace: float) -> float:
    if (
        isinstance(grace, bool)
        or not isinstance(grace, int | float)
        or not math.isfinite(grace)
        or not 0 < grace <= MAX_GRACE
    ):
        raise ConfigError(f"an auction grace must be in (0, {MAX_GRACE:g}] s, got {grace!r}")
    return float(grace)


def rank_bids(bids: Mapping[str, tuple[float, float]]) -> tuple[tuple[str, float], ...]:
    """{expert: (score, placed_at)} -> ((expert, score), ...), best first, then earliest."""
    order = sorted(bids.items(), key=lambda kv: (-kv[1][0], kv[1][1], kv[0]))
    return tuple((name, score) for name, (score, _) in order)


def rank(ranked: Sequence[tuple[str, float]], expert: str) -> int:
    """*expert*'s place in *ranked* (best first), or ``len(ranked)`` when it did not bid."""
    for n, (name, _) in enumerate(ranked):
        if name == expert:
            return n
    return len(ranked)


def may_claim_at(
    closes_at: float, grace: float, ranked: Sequence[tuple[str, float]], expert: str
) -> float:
    """When *expert* may claim a task whose auction closes at *closes_at*."""
    return closes_at + rank(ranked, expert) * grace


def open_to_all_at(closes_at: float, grace: float, bids: int) -> float:
    """When the auction stops holding anyone back: past the last ranked bidder's grace."""
    return closes_at + bids * grace
