"""``contend bench``'s latency probe on real expert processes: each stamp task reports its
start over UDP, so the figures come from just before the submit call to the task's first line."""

from __future__ import annotations

import argparse
import shutil

import pytest

from contend.cli.bench import Bench


@pytest.mark.parametrize("body", ["async", "sync"])
async def test_the_latency_probe_times_each_task_from_before_its_submit(body: str) -> None:
    bench = Bench(argparse.Namespace(quick=True, tasks=100, concurrency=2, store=None, body=body))
    try:
        await bench.latency(processes=1, concurrency=2)
    finally:
        shutil.rmtree(bench.tmp, ignore_errors=True)
    r = bench.results
    # from before the call: a task cannot start before its submit call began, and the
    # call itself is part of the latency
    assert 0 < r["submit_call_p50_ms"] < r["latency_p50_ms"] <= r["latency_p99_ms"] < 30_000
