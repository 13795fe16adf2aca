"""When a sync task type moves to the event loop and when it goes back to threads."""

from __future__ import annotations

import logging

import pytest

from contend.runtime.inline import (
    DEMOTE_OVER,
    MAX_DEMOTIONS,
    PROMOTE_AFTER,
    SHORT,
    InlinePolicy,
)

QUICK = SHORT / 10


def _promote(p: InlinePolicy, name: str = "f", runs: int = PROMOTE_AFTER) -> None:
    for _ in range(runs):
        p.ran_in_thread(name, QUICK, called_back=False)


def test_a_type_moves_to_the_loop_after_enough_short_runs_in_a_row() -> None:
    p = InlinePolicy()
    _promote(p, runs=PROMOTE_AFTER - 1)
    assert not p.on_loop("f")
    p.ran_in_thread("f", SHORT * 2, called_back=False)  # one slow run starts the count again
    _promote(p, runs=PROMOTE_AFTER - 1)
    assert not p.on_loop("f")
    p.ran_in_thread("f", QUICK, called_back=False)
    assert p.on_loop("f") and not p.on_loop("g")


def test_a_long_run_on_the_loop_sends_it_back_and_each_return_costs_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = InlinePolicy()
    _promote(p)
    p.ran_on_loop("f", DEMOTE_OVER / 2, called_back=False)
    assert p.on_loop("f")
    with caplog.at_level(logging.INFO, logger="contend.expert"):
        p.ran_on_loop("f", DEMOTE_OVER * 3, called_back=False)
    assert not p.on_loop("f")
    assert "took 6.0 ms on the event loop" in caplog.text
    _promote(p, runs=PROMOTE_AFTER * 8 - 1)
    assert not p.on_loop("f")
    _promote(p, runs=1)
    assert p.on_loop("f")


def test_after_the_last_return_it_stays_in_threads() -> None:
    p = InlinePolicy()
    for n in range(MAX_DEMOTIONS):
        _promote(p, runs=PROMOTE_AFTER * 8**n)
        assert p.on_loop("f")
        p.ran_on_loop("f", 1.0, called_back=False)
    _promote(p, runs=PROMOTE_AFTER * 8**MAX_DEMOTIONS)
    assert not p.on_loop("f")


def test_a_function_that_calls_the_sync_helpers_never_runs_on_the_loop() -> None:
    p = InlinePolicy()
    p.ran_in_thread("f", QUICK, called_back=True)
    _promote(p, runs=PROMOTE_AFTER * 8**MAX_DEMOTIONS)
    assert not p.on_loop("f")
    _promote(p, name="g")
    p.ran_on_loop("g", QUICK, called_back=True)
    _promote(p, name="g", runs=PROMOTE_AFTER * 8**MAX_DEMOTIONS)
    assert not p.on_loop("g")
