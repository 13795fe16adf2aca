"""Fault injection: wrap a store and make chosen operations fail, hang or raise on demand.

For faults below the store (a connection whose packets vanish, a reset, a refused port), put
:class:`contend.testing.proxy.FaultProxy` between a real store and its server.
"""

from __future__ import annotations

import asyncio
from typing import Any

from contend.errors import ContendError, StoreUnavailable
from contend.store.port import Store


class FaultyStore:
    """Delegates to *inner*, with faults per operation:

    * ``cut(*ops)``: they raise StoreUnavailable at once, as a lost connection would;
    * ``hang(*ops)``: they wait, sending nothing, until ``heal()`` — then they go through, as a
      call on a frozen connection does when the network comes back;
    * ``raise_on(op, error)``: it raises *error* (an ExpertConflict, a SchemaError…);
    * ``heal()`` ends every fault.

    ``calls`` counts the calls per operation (faulty ones included); ``hanging`` the calls
    waiting right now."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.failing: set[str] = set()
        self.hung: set[str] = set()
        self.raising: dict[str, ContendError] = {}
        self.calls: dict[str, int] = {}
        self.hanging = 0
        self._healed = asyncio.Event()

    def cut(self, *operations: str) -> None:
        self.failing.update(operations)

    def hang(self, *operations: str) -> None:
        self.hung.update(operations)

    def raise_on(self, operation: str, error: ContendError) -> None:
        self.raising[operation] = error

    def heal(self) -> None:
        self.failing.clear()
        self.hung.clear()
        self.raising.clear()
        self._healed.set()
        self._healed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.hung:
                self.hanging += 1
                try:
                    await self._healed.wait()
                finally:
                    self.hanging -= 1
            if name in self.failing:
                raise StoreUnavailable(f"injected fault: {name} cannot reach the store")
            if name in self.raising:
                raise self.raising[name]
            return await attr(*args, **kwargs)

        return call
