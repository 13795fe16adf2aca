"""The chaos suite's short mode, in the default test run: every scenario of
``python -m contend.testing.chaos --short`` on each backend it applies to, with the same checks
as ``make chaos`` (smaller runs). A scenario that cannot run here (no root for network
namespaces, no PostgreSQL server binaries, no etcd, no libfaketime) fails under ``CI=true`` and
is skipped elsewhere, saying what is missing."""

from __future__ import annotations

import os

import pytest

from contend.testing.chaos.runner import Scenario, missing, run_one, selected

PAIRS = selected([], [], short=True)


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "backend"), PAIRS, ids=[f"{s.name}-{b}" for s, b in PAIRS])
async def test_chaos_short(scenario: Scenario, backend: str) -> None:
    why = missing(scenario, backend)
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {why}")
        pytest.skip(f"{why} (not under CI: there this is a failure)")
    figures = await run_one(scenario, backend, short=True, keep=False)
    print(figures.line())
    assert figures.as_expected, "\n".join([figures.line(), *figures.problems, *figures.notes])
