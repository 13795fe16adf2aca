"""Public helpers for testing code that uses contend: a fake clock and the store contract."""

from contend.testing.clock import FakeClock

__all__ = ["FakeClock"]
