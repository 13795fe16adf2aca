"""The README's demo commands, small: the crash demo and the pipeline demo run to an OK report."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.acceptance.conftest import ROOT, cli_env


def _demo(*argv: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "contend", "demo", "--json", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=cli_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out: dict[str, object] = json.loads(done.stdout[done.stdout.index("{") :])
    return out


def test_the_crash_demo_reports_ok() -> None:
    report = _demo("--tasks", "300", "--experts", "2")
    assert report["ok"] is True
    assert report["killed_expert"]


def test_the_pipeline_demo_loads_every_line_under_back_pressure() -> None:
    report = _demo("--pipeline", "--lines", "30000", "--experts", "2")
    assert report["ok"] is True and report["rows_loaded"] == 30_000
    peaks = report["peak_waiting_tasks"]
    assert isinstance(peaks, dict)
    # the limit, plus at most what two experts have in flight: 4 runs and 4 claimed ahead each
    assert peaks["transform"] <= 40 + 16 and peaks["load"] <= 40 + 16, peaks
