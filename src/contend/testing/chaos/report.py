"""The figures table of docs/reliability.md, written between its markers by the runner (the
bad-input table, between markers of its own, is left as it is)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from contend.testing.chaos.verdict import Figures

START = "<!-- chaos-table: start (python -m contend.testing.chaos --write-doc writes this) -->"
END = "<!-- chaos-table: end -->"
HEADER = (
    "| fault injected | faults | tasks | lost | double commits | overlaps | refused writes "
    "| recovery min / median / max |\n|---|---:|---:|---:|---:|---:|---:|---|"
)
TITLES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "etcd": "etcd"}


def commit_of(root: Path) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except OSError:
        return "unknown"
    sha = done.stdout.strip() or "unknown"
    return f"{sha} (with uncommitted changes)" if dirty.stdout.strip() else sha


def table(figures: Sequence[Figures], *, mode: str, commit: str, wall: float) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    parts = [
        f"Run {when} at commit {commit}, {mode} mode, {wall:.0f} s in all "
        f"({sum(f.ok for f in figures)} of {len(figures)} scenarios passed).",
    ]
    for backend in TITLES:
        rows = [f for f in figures if f.backend == backend]
        if not rows:
            continue
        parts.append(f"\n**{TITLES[backend]}**\n\n{HEADER}")
        for f in rows:
            mark = "" if f.ok else " **(fails: known bug)**" if f.known else " **(failed)**"
            parts.append(
                f"| {f.fault}{mark} | {f.faults} | {f.tasks:,} | {f.lost} | {f.double_commits} "
                f"| {f.overlaps} | {f.refused} | {f.recovery_text()} |"
            )
    late = sum(f.paused_effects for f in figures)
    if late:
        parts.append(
            f"\n{late} side effect(s) were written late because the process was paused between "
            "`ctx.check()` and the write (SIGSTOP landing in that window): no check can prevent "
            "that, the fence handed to an external system can; they are not counted as overlaps."
        )
    known = sorted({f"{TITLES[f.backend]}: {f.known}" for f in figures if f.known and not f.ok})
    if known:
        parts.append("\nKnown bugs (found by the suite, reported, not fixed yet):\n")
        parts += [f"- {k}" for k in known]
    return "\n".join(parts)


def rewrite(doc: Path, text: str) -> None:
    """Put *text* between the markers of *doc* (appending them at the end the first time)."""
    body = doc.read_text()
    block = f"{START}\n{text}\n{END}"
    if START in body and END in body:
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
        body = pattern.sub(lambda _: block, body)
    else:
        body = body.rstrip("\n") + f"\n\n{block}\n"
    doc.write_text(body)
