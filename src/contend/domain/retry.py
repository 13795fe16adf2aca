"""Retry policy as a plain value: given what happened, it returns a decision."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from contend.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """``retry`` with ``delay`` seconds before the next attempt, else ``final_state``
    (``failed`` for an error that is not retryable, ``dead`` when attempts are spent)."""

    retry: bool
    delay: float = 0.0
    final_state: str = "dead"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential back-off with jitter.

    ``max_attempts`` counts every run, the first included. The delay before attempt *n+1* is
    ``min(max_backoff, backoff × factor**(n-1))`` spread by ±``jitter``. Exceptions that are
    instances of ``retry_on`` and not of ``dont_retry_on`` are retried; timeouts and lost
    experts (crashes) always count as retryable failures.
    """

    max_attempts: int = 3
    backoff: float = 1.0
    factor: float = 2.0
    max_backoff: float = 300.0
    jitter: float = 0.1
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dont_retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"max_attempts must be an integer, got {self.max_attempts!r}")
        if not 1 <= self.max_attempts <= 1000:
            raise ConfigError(f"max_attempts must be between 1 and 1000, got {self.max_attempts}")
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a non-negative number, got {value!r}")
        if not isinstance(self.factor, int | float) or not 1 <= self.factor <= 100:
            raise ConfigError(f"factor must be between 1 and 100, got {self.factor!r}")
        if not isinstance(self.jitter, int | float) or not 0 <= self.jitter < 1:
            raise ConfigError(f"jitter must be in [0, 1), got {self.jitter!r}")

    @classmethod
    def of(cls, retries: int | RetryPolicy | None) -> RetryPolicy:
        """``retries=N`` means N retries after the first attempt."""
        if retries is None:
            return cls()
        if isinstance(retries, RetryPolicy):
            return retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries must be a non-negative integer, got {retries!r}")
        return cls(max_attempts=retries + 1)

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        base = 0.0
        if self.backoff > 0:
            # In logarithms: factor ** n alone overflows long before backoff × factor ** n
            # does when backoff is tiny (2.2e-311 × 54 ** 178 is about 0.005).
            n, cap = max(0, attempt - 1), self.max_backoff
            log_grown = math.log(self.backoff) + n * math.log(self.factor)
            if cap <= 0 or log_grown >= math.log(cap):
                base = cap
            else:
                try:
                    base = min(cap, self.backoff * float(self.factor) ** n)  # exact when it fits
                except OverflowError:
                    base = math.exp(log_grown)
        return max(0.0, base * (1 + self.jitter * (2 * rand() - 1)))

    def decide(
        self,
        attempt: int,
        error: BaseException | None,
        *,
        max_attempts: int | None = None,
        rand: Callable[[], float] = random.random,
    ) -> RetryDecision:
        """Decide after attempt number *attempt* (1-based) failed with *error*
        (None: a timeout or a lost expert, always retryable)."""
        limit = self.max_attempts if max_attempts is None else max_attempts
        if error is not None and (
            not isinstance(error, self.retry_on) or isinstance(error, self.dont_retry_on)
        ):
            return RetryDecision(retry=False, final_state="failed")
        if attempt >= limit:
            return RetryDecision(retry=False, final_state="dead")
        return RetryDecision(retry=True, delay=self.delay(attempt, rand))
