"""The rate and fair-share rules of ``contend.domain.limits``: what a rate string means, the
GCRA's bound in any window, and the fair order among keys."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contend.domain.limits import FairCandidate, Rate, admit, fair_order, rooms, spend
from contend.errors import TaskError


@pytest.mark.parametrize(
    ("text", "interval"),
    [
        ("10/s", 0.1),
        ("600/m", 0.1),
        ("2/h", 1800.0),
        ("1/d", 86400.0),
        ("5/2.5s", 0.5),
        ("3/1", 1 / 3),
        ((4, 2.0), 0.5),
        (" 20 / S ", 0.05),
    ],
)
def test_a_rate_names_its_interval(text: str | tuple[float, float], interval: float) -> None:
    assert math.isclose(Rate.of(text).interval, interval)


def test_room_and_after_follow_the_gcra() -> None:
    r = Rate(interval=1.0, burst=3)
    assert r.room(None, 100.0) == 3  # never started: the whole burst
    tat = r.after(None, 100.0, 3)
    assert tat == 103.0 and r.room(tat, 100.0) == 0
    assert r.room(tat, 100.999) == 0 and r.room(tat, 101.0) == 1
    assert r.room(tat, 200.0) == 3  # idle time does not pile up past the burst
    assert Rate(0.5).text() == "2/s" and Rate(60.0, 4).text() == "1/m (burst 4)"


@given(
    st.lists(st.floats(min_value=0, max_value=0.3), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=1, max_value=6),
)
def test_no_window_ever_holds_more_than_burst_plus_its_length_in_intervals(
    steps: list[float], burst: int, asks: int
) -> None:
    rate = Rate(interval=0.1, burst=burst)
    state: dict[str, tuple[Rate, float | None]] = {"k": (rate, None)}
    now, starts = 0.0, []
    for step in steps:
        now += step
        got = admit([(str(i), "k", None) for i in range(asks)], {}, asks, rooms(state, now))
        starts += [now] * len(got)
        state["k"] = (rate, spend(["k"] * len(got), state, now).get("k", state["k"][1]))
    for i, t0 in enumerate(starts):
        for j in range(i, len(starts)):
            w = starts[j] - t0
            assert j - i + 1 <= burst + w / rate.interval + 1e-6


def test_fair_order_evens_out_the_keys() -> None:
    a = [FairCandidate(f"a{i}", "a", 0, 0, float(i)) for i in range(10)]
    b = [FairCandidate(f"b{i}", "b", 0, 0, 100.0 + i) for i in range(2)]
    assert fair_order([*a, *b], {}, 4) == ["a0", "b0", "a1", "b1"]
    assert fair_order([*a, *b], {"a": 3}, 3) == ["b0", "b1", "a0"]  # a holds three already
    urgent = FairCandidate("a-urgent", "a", 9, 9, 50.0)
    assert fair_order([*a, urgent, *b], {"a": 5}, 1) == ["a-urgent"]  # priority first


@pytest.mark.parametrize("bad", ["", "ten/s", "10", "0/s", "5/0s", "1/fortnight", (1,), [1, 2]])
def test_a_bad_rate_says_what_a_rate_looks_like(bad: object) -> None:
    with pytest.raises(TaskError, match="rate limit must be"):
        Rate.of(bad)  # type: ignore[arg-type]
