"""``contend bench``: placeholder until the benchmark lands."""

from __future__ import annotations

import argparse


async def run_bench(args: argparse.Namespace) -> int:
    raise NotImplementedError
