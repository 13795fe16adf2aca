"""The CLI's long-running commands, end to end in subprocesses."""

from __future__ import annotations

from pathlib import Path

from tests.acceptance.conftest import run_cli


def test_bench_quick_runs_end_to_end(tmp_path: Path) -> None:
    """A smoke test of ``contend bench``: real expert processes, every measurement, no file."""
    done = run_cli("bench", "--quick", "--out", str(tmp_path / "b.md"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in ("submit:", "drain:", "latency", "peak memory"):
        assert line in done.stdout
    assert not (tmp_path / "b.md").exists()
