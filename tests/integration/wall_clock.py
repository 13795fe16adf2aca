"""Running a snippet in a process of its own whose wall clock is stepped (libfaketime), for the
tests of what a step of the host's clock does (the chaos suite's clock scenario found them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from contend.testing.chaos import clock
from contend.testing.chaos.procs import child_env


def need_libfaketime() -> None:
    why = clock.missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {why}")
        pytest.skip(f"{why} (not under CI: there this is a failure)")


def run_stepped(script: str, offset_file: Path, *args: str, timeout: float = 60) -> str:
    """Run *script* (``step(seconds)`` in it steps its own wall clock); its stdout."""
    prelude = (
        "import os\n"
        "def step(seconds):\n"
        f"    tmp = {str(offset_file)!r} + '.tmp'\n"
        "    open(tmp, 'w').write(f'{seconds:+d}\\n')\n"
        f"    os.replace(tmp, {str(offset_file)!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(clock.faked_env(offset_file)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()
