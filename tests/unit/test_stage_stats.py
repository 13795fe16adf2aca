"""``stage_stats``: each pipeline stage's backlog, rate and back-pressure, read from one
StoreStats (the helper ``contend status --app`` prints)."""

from __future__ import annotations

from contend import App
from contend.runtime.pipeline import stage_stats
from contend.store.port import StoreStats


def _pipeline(limit: int) -> App:
    app = App("memory://")

    def a(records: list[int]) -> list[int]:
        return records

    def b(records: list[int]) -> int:
        return len(records)

    app.pipeline("p", a, b, limit=limit)
    return app


def test_each_stage_from_the_counts_of_its_queue() -> None:
    app = _pipeline(limit=5)
    stats = StoreStats(
        now=0.0,
        counts={
            "p.a": {"pending": 2, "claimed": 1, "running": 3, "failed": 1, "dead": 2},
            "p.b": {"pending": 5, "succeeded": 9},
            "other": {"pending": 100},
        },
        experts=[],
        done_last_minute=39,
        oldest_pending_age=None,
        done_by_queue={"p.a": 30, "p.b": 9},
    )
    first, last = stage_stats(app.pipelines["p"], stats)
    assert (first.stage, first.pending, first.running, first.backlog) == ("p.a", 2, 4, 6)
    assert (first.done_last_minute, first.rate, first.failed) == (30, 0.5, 3)
    assert first.held is False  # 5 pending downstream is the limit, not above it
    assert (last.pending, last.running, last.rate, last.held) == (5, 0, 9 / 60, False)
    assert last.to_json()["backlog"] == 5


def test_a_stage_is_held_while_the_next_queue_is_over_the_limit() -> None:
    app = _pipeline(limit=5)
    stats = StoreStats(0.0, {"p.b": {"pending": 6}}, [], 0, None)
    first, last = stage_stats(app.pipelines["p"], stats)
    assert first.held is True and first.rate == 0.0 and first.backlog == 0
    assert last.held is False
