"""What the contract suite runs on: a :class:`Harness` per backend, registered by name.

A backend is added by writing one factory and decorating it with :func:`backend`::

    @backend("mystore")
    @asynccontextmanager
    async def my_harness(tmp_path: Path) -> AsyncIterator[Harness]:
        store = MyStore(..., clock=clock)
        await store.open()
        try:
            yield Harness("mystore", store, advance, new_store)
        finally:
            await store.close()

The factory builds an *opened* store on a fresh, empty target, says how to move that store's
clock, how to open another independent instance on the same data, and cleans everything up
when the context exits. The ``harness`` fixture (``contend.testing.contract.plugin``) and the
Hypothesis state machine (``contend.testing.contract.stateful``) take their backends from
:data:`BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from contend.store.port import Store
from contend.testing.counters import Counter, counter_for


@dataclass
class Harness:
    """One backend under test.

    * ``store`` — opened, on an empty target.
    * ``advance(seconds)`` — move the store's clock forward (a fake clock where the backend
      takes one; a backend on a real clock may sleep).
    * ``new_store()`` — another independent, opened instance (connection, client) on the same
      data, closed by the harness; a backend with no such notion may return ``store`` itself.
    * ``ttl`` — the lease length the tests use; a real-clock backend may ask for a short one.
      Tests express their waits and delays in multiples of it where they can.
    * ``tolerance`` — how far (seconds) two readings of the store's clock taken around one call
      may differ; 0 for a fake clock, a little for a real one. ``at(t)`` compares with it.
    * ``extra["counter"]`` — for a backend with transactions that
      :func:`contend.testing.counters.counter_for` does not know: ``name -> Counter``, a counter
      in the store's own database that a task's transaction increments.
    """

    name: str
    store: Store
    advance: Callable[[float], Awaitable[None]]
    new_store: Callable[[], Awaitable[Store]]
    ttl: float = 10.0
    tolerance: float = 1e-6
    extra: dict[str, Any] = field(default_factory=dict)

    def counter(self, name: str = "hits") -> Counter:
        """A counter in the store's own database (see ``extra["counter"]``)."""
        make = self.extra.get("counter")
        return make(name) if make is not None else counter_for(self.store, name)

    def at(self, t: float) -> Any:
        """A time on the store's clock, compared with ``tolerance``: ``x == h.at(now + 5)``."""
        return pytest.approx(t, rel=0, abs=self.tolerance)


Factory = Callable[[Path], AbstractAsyncContextManager[Harness]]


@dataclass(frozen=True)
class Backend:
    name: str
    factory: Factory
    marks: tuple[pytest.MarkDecorator, ...] = ()
    fake_clock: bool = True  # the state machine jumps the clock a lot: fake clocks only


#: name -> backend; the fixture is parametrized over these, in this order.
BACKENDS: dict[str, Backend] = {}


def backend(
    name: str,
    *,
    marks: tuple[pytest.MarkDecorator, ...] | list[pytest.MarkDecorator] = (),
    fake_clock: bool = True,
) -> Callable[[Factory], Factory]:
    def register(factory: Factory) -> Factory:
        if name in BACKENDS:
            raise ValueError(f"backend {name!r} is registered twice")
        BACKENDS[name] = Backend(name, factory, tuple(marks), fake_clock)
        return factory

    return register


def backend_params(*, fake_clock_only: bool = False) -> list[Any]:
    """``pytest.param`` for every backend, with its marks and its name as the id."""
    return [
        pytest.param(b.name, marks=b.marks, id=b.name)
        for b in BACKENDS.values()
        if b.fake_clock or not fake_clock_only
    ]
