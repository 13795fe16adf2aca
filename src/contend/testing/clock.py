"""A clock that moves only when told to, for lease and back-off logic without waiting."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.value = float(start)

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.value += seconds
