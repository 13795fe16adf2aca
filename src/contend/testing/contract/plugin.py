"""The suite's fixture: ``harness``, one per registered backend (import it into a conftest).

Backends are parametrized when tests are collected, after every conftest has registered its
own, so the order of imports does not matter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from contend.testing.contract.harness import BACKENDS, Harness, backend_params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" in metafunc.fixturenames:
        metafunc.parametrize("harness", backend_params(), indirect=True)
    if "contract_backend" in metafunc.fixturenames:  # the state machine: fake clocks only
        metafunc.parametrize("contract_backend", backend_params(fake_clock_only=True))


@pytest.fixture
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """An opened store on an empty target, for every registered backend."""
    async with BACKENDS[request.param].factory(tmp_path) as h:
        yield h
