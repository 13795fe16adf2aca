"""Fault injection: wrap a store and make chosen operations fail on demand."""

from __future__ import annotations

from typing import Any

from contend.errors import StoreError
from contend.store.port import Store


class FaultyStore:
    """Delegates to *inner*; every operation named in ``failing`` raises StoreError instead,
    as a lost connection would. ``cut(...)`` and ``heal()`` switch faults on and off."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.failing: set[str] = set()
        self.calls: dict[str, int] = {}

    def cut(self, *operations: str) -> None:
        self.failing.update(operations)

    def heal(self) -> None:
        self.failing.clear()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.failing:
                raise StoreError(f"injected fault: {name} cannot reach the store")
            return await attr(*args, **kwargs)

        return call
