"""What someone outside this repository gets: the wheel and the sdist that ``python -m build``
makes, each installed into a fresh venv of its own, then the installed ``contend`` run.

Everything happens under the test's tmp_path: the build reads a copy of the work tree (the
files git tracks or would track), since building an sdist writes ``*.egg-info`` next to the
sources. Nothing is fetched but what pip's configured registry serves (setuptools, for the
build's isolated environment); the wheel itself needs nothing, as contend has no dependency
outside its extras."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.slow

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME, VERSION = PROJECT["name"], PROJECT["version"]


def clean_env() -> dict[str, str]:
    """The environment without what would let the repo's sources stand in for the install."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEND_")}
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH"):
        env.pop(name, None)
    return env


def run(cmd: list[str], what: str, cwd: Path, timeout: float = 120) -> str:
    """Run *cmd*; fail the test, with the end of its output, unless it exits 0."""
    try:
        done = subprocess.run(
            cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} took more than {timeout}s: {cmd}\n{exc.stdout!r}\n{exc.stderr!r}")
    if done.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )
    return done.stdout


def source_files() -> list[str]:
    """The work tree's files as a fresh clone (plus new, not yet committed ones) would have."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(p for p in out.split("\0") if p and (ROOT / p).is_file())


def copy_tree(dest: Path) -> list[str]:
    files = source_files()
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return files


def build(kind: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """``python -m build --<kind>`` on a copy of the tree; the one file it made, and the
    tree's files."""
    try:
        import build as _build  # noqa: F401
    except ImportError:
        pytest.fail("the 'build' package is missing: pip install -e '.[dev]'")
    tree, out = tmp_path / "tree", tmp_path / "dist"
    files = copy_tree(tree)
    run(
        [sys.executable, "-m", "build", f"--{kind}", "--outdir", str(out), str(tree)],
        f"python -m build --{kind}",
        tmp_path,
        timeout=180,
    )
    made = sorted(out.iterdir())
    assert len(made) == 1, made
    return made[0], files


def fresh_venv(where: Path) -> Path:
    """An empty venv (no pip of its own: ensurepip costs 5 s; this pip installs into it)."""
    venv.EnvBuilder(with_pip=False, clear=True).create(where)
    return where / "bin"


def pip_install(bin_: Path, what: Path, cwd: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", str(bin_ / "python"), "install"]
    run([*cmd, "--no-input", str(what)], f"pip install {what.name}", cwd, timeout=180)


def shipped_sources(files: list[str]) -> list[str]:
    """The package's own files, as paths inside it (``contend/…``)."""
    return [f.removeprefix("src/") for f in files if f.startswith("src/contend/")]


def test_the_wheel_installs_alone_and_runs_the_demo(tmp_path: Path) -> None:
    wheel, files = build("wheel", tmp_path)
    assert wheel.name == f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        inside = set(z.namelist())
        metadata = z.read(f"{NAME}-{VERSION}.dist-info/METADATA").decode()
        entry_points = z.read(f"{NAME}-{VERSION}.dist-info/entry_points.txt").decode()
    missing = [f for f in shipped_sources(files) if f not in inside]
    assert not missing, f"the wheel lacks {missing}"  # the dashboard's static files, py.typed
    assert not [n for n in inside if n.startswith(("tests/", "benchmarks/", "docs/"))]
    assert "contend = contend.cli.main:main" in entry_points
    assert f"Version: {VERSION}" in metadata and "Requires-Dist: starlette" in metadata

    bin_ = fresh_venv(tmp_path / "venv")
    pip_install(bin_, wheel, tmp_path)
    version = run([str(bin_ / "contend"), "--version"], "contend --version", tmp_path)
    assert version.strip() == f"contend {VERSION}"
    where = run(
        [str(bin_ / "python"), "-c", "import contend; print(contend.__file__)"],
        "import contend",
        tmp_path,
    )
    assert Path(where.strip()).is_relative_to(tmp_path / "venv"), where

    # without its extra, the dashboard says which one to install, and changes nothing
    refused = subprocess.run(
        [str(bin_ / "contend"), "dashboard", "--store", f"sqlite:///{tmp_path / 'x.db'}"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    # contend is on no index: the hint names what the extra installs, read from the wheel
    assert "pip install 'starlette>=0.40'" in refused.stderr, refused.stderr
    assert "'dashboard' extra" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "x.db").exists()

    # the README's first command, `make demo`, runs `contend demo`: here a short run of it.
    # Three experts, since with two only one may be killed (the other alone has `geo`), and
    # on a busy machine that one may hold no task whenever the demo looks.
    out = run(
        [str(bin_ / "contend"), "demo", "--tasks", "300", "--experts", "3", "--json"],
        "contend demo",
        tmp_path,
        timeout=120,
    )
    report = json.loads(out[out.index("{") :])
    assert report["ok"] is True, report
    assert report["states"] == {"succeeded": 300}
    assert report["committed_more_than_once"] == 0 and report["results_wrong"] == 0
    assert report["checked_exactly_once"] == 300 and report["killed_expert"], report


def test_the_sdist_carries_the_sources_and_installs(tmp_path: Path) -> None:
    sdist, files = build("sdist", tmp_path)
    assert sdist.name == f"{NAME}-{VERSION}.tar.gz"
    top = f"{NAME}-{VERSION}/"
    with tarfile.open(sdist) as t:
        inside = {m.name.removeprefix(top) for m in t.getmembers() if m.isfile()}
        pkg_info = t.extractfile(top + "PKG-INFO").read().decode()  # type: ignore[union-attr]
    wanted = ["pyproject.toml", "README.md", *(f for f in files if f.startswith("src/contend/"))]
    wanted += [f for f in files if "/" not in f and f.upper().startswith(("LICENSE", "COPYING"))]
    missing = [f for f in wanted if f not in inside]
    assert not missing, f"the sdist lacks {missing}"
    assert f"Version: {VERSION}" in pkg_info
    assert "Decentralized task scheduling" in pkg_info  # the README is its long description

    bin_ = fresh_venv(tmp_path / "venv")
    pip_install(bin_, sdist, tmp_path)
    version = run([str(bin_ / "contend"), "--version"], "contend --version", tmp_path)
    assert version.strip() == f"contend {VERSION}"
    installed = run(
        [
            str(bin_ / "python"),
            "-c",
            "import contend, pathlib; print(sorted(p.name for p in "
            "pathlib.Path(contend.__file__).parent.joinpath('dashboard', 'static').iterdir()))",
        ],
        "list the dashboard's static files",
        tmp_path,
    )
    assert "dashboard.js" in installed and "dashboard.css" in installed
