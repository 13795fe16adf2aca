"""contend.domain.retry and contend.domain.scoring: policies are plain values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contend.domain.retry import RetryDecision, RetryPolicy
from contend.domain.scoring import (
    SPECIALIST_EDGE,
    ExpertView,
    TaskView,
    adaptive_window,
    default_fitness,
    race_delay,
)
from contend.domain.task import Capabilities, Requirements
from contend.errors import ConfigError

# -- RetryPolicy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_attempts": 0}, "max_attempts must be between 1 and 1000"),
        ({"max_attempts": 1001}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts must be an integer"),
        ({"max_attempts": 2.0}, "max_attempts must be an integer"),
        ({"backoff": -1}, "backoff must be a non-negative number"),
        ({"backoff": math.nan}, "backoff"),
        ({"max_backoff": math.inf}, "max_backoff"),
        ({"factor": 0.5}, "factor must be between 1 and 100"),
        ({"factor": 101}, "factor"),
        ({"jitter": 1.0}, r"jitter must be in \[0, 1\)"),
        ({"jitter": -0.1}, "jitter"),
    ],
)
def test_retry_policy_refuses_bad_settings(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_retry_policy_of() -> None:
    assert RetryPolicy.of(None) == RetryPolicy()
    assert RetryPolicy.of(0).max_attempts == 1
    assert RetryPolicy.of(4).max_attempts == 5
    p = RetryPolicy(max_attempts=9)
    assert RetryPolicy.of(p) is p
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ConfigError, match="retries must be a non-negative integer"):
            RetryPolicy.of(bad)  # type: ignore[arg-type]


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


def test_decide_retries_while_attempts_remain_then_dead() -> None:
    p = RetryPolicy(max_attempts=3, backoff=1, factor=2, jitter=0)
    first = p.decide(1, Transient())
    assert first == RetryDecision(retry=True, delay=1.0)
    assert p.decide(2, Transient()) == RetryDecision(retry=True, delay=2.0)
    assert p.decide(3, Transient()) == RetryDecision(retry=False, final_state="dead")
    assert p.decide(7, Transient()) == RetryDecision(retry=False, final_state="dead")


def test_decide_a_non_retryable_error_is_failed_at_once() -> None:
    p = RetryPolicy(max_attempts=5, retry_on=(Transient,), dont_retry_on=(Permanent,))
    assert p.decide(1, Permanent()) == RetryDecision(retry=False, final_state="failed")
    assert p.decide(1, ValueError()) == RetryDecision(retry=False, final_state="failed")
    assert p.decide(1, Transient()).retry
    q = RetryPolicy(max_attempts=5, dont_retry_on=(KeyError,))
    assert not q.decide(1, KeyError()).retry
    assert q.decide(1, ValueError()).retry


def test_decide_a_timeout_or_lost_expert_is_always_retryable() -> None:
    p = RetryPolicy(max_attempts=2, retry_on=(Transient,))
    assert p.decide(1, None).retry
    assert p.decide(2, None) == RetryDecision(retry=False, final_state="dead")


def test_decide_honours_a_per_task_max_attempts() -> None:
    p = RetryPolicy(max_attempts=2)
    assert p.decide(2, None, max_attempts=4).retry
    assert not p.decide(4, None, max_attempts=4).retry
    assert not p.decide(1, None, max_attempts=1).retry


def test_delay_grows_exponentially_up_to_the_cap() -> None:
    p = RetryPolicy(backoff=0.5, factor=3, max_backoff=10, jitter=0)
    assert [p.delay(n) for n in range(1, 6)] == [0.5, 1.5, 4.5, 10.0, 10.0]
    assert p.delay(0) == 0.5
    assert RetryPolicy(backoff=0, jitter=0.5).delay(3) == 0.0
    assert p.delay(10_000) == 10.0  # no overflow for a huge attempt number
    long = RetryPolicy(max_attempts=1000, factor=3, max_backoff=60, jitter=0)
    assert long.delay(999) == 60.0
    assert RetryPolicy(factor=100, max_attempts=1000).decide(999, None).delay <= 300 * 1.1


@given(
    attempt=st.integers(1, 1000),
    backoff=st.floats(0, 100),
    factor=st.one_of(st.floats(1, 100), st.integers(1, 100)),
    max_backoff=st.floats(0, 3600),
    jitter=st.floats(0, 0.99),
    r=st.floats(0, 1),
)
def test_delay_stays_within_its_jitter_bounds(
    attempt: int, backoff: float, factor: float, max_backoff: float, jitter: float, r: float
) -> None:
    p = RetryPolicy(backoff=backoff, factor=factor, max_backoff=max_backoff, jitter=jitter)
    log_grown = math.log(backoff) + (attempt - 1) * math.log(factor) if backoff else -math.inf
    base = max_backoff if log_grown > 700 else min(max_backoff, math.exp(log_grown))
    d = p.delay(attempt, rand=lambda: r)
    assert d >= 0
    assert base * (1 - jitter) - 1e-9 <= d <= base * (1 + jitter) + 1e-9
    assert d <= max_backoff * (1 + jitter) + 1e-9


def test_a_tiny_backoff_grows_without_overflowing_to_the_cap() -> None:
    """factor ** 178 overflows a float while 2.2e-311 × 54 ** 178 is about 0.005 (found by
    Hypothesis: the delay came out as max_backoff)."""
    p = RetryPolicy(backoff=2.2e-311, factor=54, max_backoff=1.0, jitter=0.0)
    expected = math.exp(math.log(2.2e-311) + 178 * math.log(54))
    assert p.delay(179) == pytest.approx(expected)
    assert p.delay(179) < 0.01


def test_delay_jitter_spreads_both_ways() -> None:
    p = RetryPolicy(backoff=10, jitter=0.1)
    assert p.delay(1, rand=lambda: 0.0) == pytest.approx(9.0)
    assert p.delay(1, rand=lambda: 1.0) == pytest.approx(11.0)
    assert p.delay(1, rand=lambda: 0.5) == pytest.approx(10.0)


# -- race and window -------------------------------------------------------------------------------


def test_race_delay_the_fittest_goes_first() -> None:
    mid = lambda: 0.5  # noqa: E731 - no jitter
    assert race_delay(1.0, 1.0) == 0.0
    assert race_delay(1.0, 0.0, rand=mid) == pytest.approx(1.0)
    assert race_delay(2.0, 0.75, rand=mid) == pytest.approx(0.5)
    assert race_delay(0.0, 0.3) == 0.0
    assert race_delay(-1.0, 0.3) == 0.0
    assert race_delay(1.0, 1.7) == 0.0  # clamped
    assert race_delay(1.0, -3, rand=mid) == pytest.approx(1.0)


@given(
    window=st.floats(0.001, 60),
    f1=st.floats(0, 1),
    f2=st.floats(0, 1),
    jitter=st.floats(0, 0.5),
    r=st.floats(0, 1),
)
def test_race_delay_is_bounded_and_ordered_by_fitness(
    window: float, f1: float, f2: float, jitter: float, r: float
) -> None:
    lo, hi = sorted((f1, f2))
    d_lo = race_delay(window, lo, jitter, rand=lambda: r)
    d_hi = race_delay(window, hi, jitter, rand=lambda: r)
    assert d_hi <= d_lo + 1e-12
    assert 0 <= d_lo <= window * (1 + jitter) + 1e-9
    assert d_lo >= window * (1 - lo) * (1 - jitter) - 1e-9


def test_adaptive_window_grows_with_cluster_load() -> None:
    assert adaptive_window(0.1, 0.0) == pytest.approx(0.1)
    assert adaptive_window(0.1, 0.8) == pytest.approx(0.2)
    assert adaptive_window(0.1, 0.4) == pytest.approx(0.15)
    assert adaptive_window(0.1, 5.0) == adaptive_window(0.1, 1.0) == pytest.approx(0.225)
    assert adaptive_window(0.1, -1.0) == pytest.approx(0.1)


# -- fitness -----------------------------------------------------------------------------------


def _task(req: Requirements | None = None, type: str = "t") -> TaskView:
    return TaskView("id", type, "default", 0, req or Requirements(), 0.0)


def test_default_fitness() -> None:
    gpu = ExpertView("e", Capabilities(frozenset({"gpu"})), capacity=4)
    assert default_fitness(ExpertView("cpu"), _task(Requirements.of("gpu"))) == 0.0
    idle = default_fitness(gpu, _task(Requirements.of("gpu")))
    busy = default_fitness(
        ExpertView("e", Capabilities(frozenset({"gpu"})), capacity=4, load=4),
        _task(Requirements.of("gpu")),
    )
    # the top of the scale is the specialist's
    assert idle == pytest.approx(1 - SPECIALIST_EDGE) and busy == pytest.approx(idle / 2)
    special = ExpertView("s", capacity=2, load=1, specialties=frozenset({"t"}))
    plain = ExpertView("p", capacity=2, load=1)
    assert default_fitness(special, _task()) == pytest.approx(
        default_fitness(plain, _task()) + SPECIALIST_EDGE
    )
    assert default_fitness(special, _task(type="other")) == default_fitness(plain, _task())


def test_a_specialist_beats_an_idle_generalist_that_fits_exactly() -> None:
    # a bonus added and capped at 1 was worth nothing here: both scored 1.0
    special = ExpertView("s", specialties=frozenset({"t"}))
    plain = ExpertView("p")
    assert default_fitness(special, _task()) == 1.0
    assert default_fitness(plain, _task()) == pytest.approx(1 - SPECIALIST_EDGE)
    # a busy specialist yields to an idle generalist
    busy = ExpertView("s", capacity=2, load=2, specialties=frozenset({"t"}))
    assert default_fitness(busy, _task()) < default_fitness(plain, _task())


@given(
    load=st.integers(0, 100),
    capacity=st.integers(0, 16),
    tags=st.frozensets(st.sampled_from(["a", "b", "c"])),
    need=st.frozensets(st.sampled_from(["a", "b"])),
    special=st.booleans(),
)
def test_default_fitness_is_a_score_in_0_1(
    load: int, capacity: int, tags: frozenset[str], need: frozenset[str], special: bool
) -> None:
    e = ExpertView(
        "e",
        Capabilities(tags),
        capacity=capacity,
        load=load,
        specialties=frozenset({"t"}) if special else frozenset(),
    )
    f = default_fitness(e, _task(Requirements(need)))
    assert 0.0 <= f <= 1.0
    if not need <= tags:
        assert f == 0.0
    assert 0.0 <= e.headroom <= 1.0
