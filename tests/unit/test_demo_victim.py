"""The crash demo's choice of which expert it may kill."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from contend.cli.demo import DemoRun, _replaceable
from contend.domain.task import Requirements


def _run() -> DemoRun:
    run = DemoRun(url="sqlite:///x", workdir="/tmp")
    run.caps = {"alpha": ["geo", "ssd"], "bravo": ["ssd"]}
    live = SimpleNamespace(returncode=None)
    run.procs = {"alpha": live, "bravo": live}  # type: ignore[dict-item]
    return run


def _task(*tags: str) -> Any:
    return SimpleNamespace(requirements=Requirements.of(list(tags)))


def test_the_only_geo_expert_is_kept_while_geo_work_is_left() -> None:
    run = _run()
    assert not _replaceable(run, "alpha", [_task(), _task("geo")])
    assert _replaceable(run, "bravo", [_task(), _task("geo")])


def test_the_only_geo_expert_may_go_once_no_geo_work_is_left() -> None:
    # before, alpha was never a victim in a two-expert demo; when the last tasks left were
    # alpha's, the demo ended without a crash (CI, stop 25)
    assert _replaceable(_run(), "alpha", [_task(), _task("ssd")])


def test_a_dead_expert_replaces_nobody() -> None:
    run = _run()
    run.procs["bravo"] = SimpleNamespace(returncode=-9)  # type: ignore[assignment]
    assert not _replaceable(run, "alpha", [_task("ssd")])
