"""The app of ``benchmarks.idle_cpu``: one task type, never submitted."""

from __future__ import annotations

from contend import App

app = App()


@app.task
def noop() -> None:
    return None
