def commit() -> str:
    """The short hash of the commit a benchmark runs on, for its report ("?" without git)."""
    import subprocess
    from pathlib import Path

    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        ).stdout.strip()
    except OSError:
        return "?"
