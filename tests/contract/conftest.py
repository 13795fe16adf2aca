from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract.backends import BACKENDS, Harness, backend_params


@pytest.fixture(params=backend_params())
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """An opened store on an empty target, for every registered backend."""
    async with BACKENDS[request.param].factory(tmp_path) as h:
        yield h
