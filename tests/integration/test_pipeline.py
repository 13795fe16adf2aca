"""Pipelines on a real SQLite file: records flow through the stages without user glue, none
lost or doubled, and a slow last stage holds the ones above it under their limit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from contend import App, TaskState
from contend.errors import ConfigError
from tests.integration.test_runtime import eventually, expert


def _logs(n: int) -> list[str]:
    return [f"10.0.0.{i % 7} GET /page/{i} {200 if i % 5 else 500}" for i in range(n)]


async def test_records_flow_through_every_stage_once(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'flow.db'}")
    loaded: list[dict[str, Any]] = []

    async def extract(lines: list[str]) -> list[dict[str, Any]]:
        out = []
        for line in lines:
            ip, _method, path, status = line.split()
            out.append({"ip": ip, "path": path, "status": int(status)})
        return out

    def transform(records: list[dict[str, Any]]) -> list[dict[str, Any]]:  # sync works too
        return [dict(r, error=r["status"] >= 500) for r in records]

    async def load(records: list[dict[str, Any]]) -> int:
        loaded.extend(records)
        return len(records)

    logs = app.pipeline("logs", extract, transform, load, batch=250)
    assert logs.stages == ("logs.extract", "logs.transform", "logs.load")
    await logs.feed(_logs(5_000), key="run-1")
    await logs.feed(_logs(5_000), key="run-1")  # fed again: nothing more
    store = await app.store()

    async def loaded_all() -> bool:
        return (await store.stats()).counts.get("logs.load", {}).get("succeeded", 0) >= 20

    async with expert(app, concurrency=4):
        await eventually(loaded_all, timeout=30)
    assert len(loaded) == 5_000
    assert sorted(r["path"] for r in loaded) == sorted(f"/page/{i}" for i in range(5_000))
    assert sum(r["error"] for r in loaded) == 1_000
    stats = await store.stats()
    assert {q: c.get("succeeded") for q, c in stats.counts.items()} == {
        "logs.extract": 20,
        "logs.transform": 20,
        "logs.load": 20,
    }
    done = [t for t in await store.list_tasks(state=TaskState.SUCCEEDED, limit=100)]
    extract_result = next(t.result for t in done if t.type == "logs.extract")
    assert extract_result == {"records": 250, "tasks": 1}
    await app.aclose()


async def test_a_slow_stage_holds_the_ones_above_under_their_limit(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'pressure.db'}")

    async def split(lines: list[int]) -> list[int]:
        return lines

    async def double(records: list[int]) -> list[int]:
        return [2 * r for r in records]

    async def store_slowly(records: list[int]) -> int:
        await asyncio.sleep(0.02)
        return len(records)

    app.pipeline("p", split, double, store_slowly, batch=1, limit=10)
    await app.pipelines["p"].feed(list(range(300)))
    store = await app.store()
    peaks = {"p.double": 0, "p.store_slowly": 0}
    # claim_ahead=4: what an expert holds is bounded (by default it claims ahead of short
    # runs as their time warrants, and a loaded machine made that 30 and more)
    async with expert(app, concurrency=4, claim_ahead=4):
        while True:
            stats = await store.stats()
            for q in peaks:
                peaks[q] = max(peaks[q], stats.counts.get(q, {}).get("pending", 0))
            if stats.counts.get("p.store_slowly", {}).get("succeeded", 0) == 300:
                break
            await asyncio.sleep(0.01)
    # the limit, and at most what the expert had in flight when it closed: its 4 runs and
    # up to 4 tasks claimed ahead (a loaded CI machine saw 16)
    assert peaks["p.store_slowly"] <= 10 + 2 * 4, peaks
    assert peaks["p.double"] <= 10 + 2 * 4, peaks
    # the source itself was not held: all 300 were fed at once
    await app.aclose()


def test_pipelines_are_checked_when_defined() -> None:
    app = App("memory://")

    def one(records: list[int]) -> list[int]:
        return records

    def two(records: list[int], factor: int) -> list[int]:
        return records

    with pytest.raises(ConfigError, match="at least two stages"):
        app.pipeline("p", one)
    with pytest.raises(ConfigError, match="one list of records"):
        app.pipeline("p", one, two)
    with pytest.raises(ConfigError, match="batch"):
        app.pipeline("p", one, lambda records: records, batch=0)
    with pytest.raises(ConfigError, match="twice"):
        app.pipeline("p", one, one)
    assert app.pipelines == {} and app.tasks == {}
