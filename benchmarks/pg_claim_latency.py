"""Claim and peek latency on PostgreSQL behind a backlog, by kind of task.

``python -m benchmarks.pg_claim_latency [--kind plain|limited|rated|fair] [--tasks 10000]
[--claims 300]`` fills a fresh database (``contend.testing.postgres.fresh_database``: the
server of ``CONTEND_TEST_PG``) with ``--tasks`` pending tasks of one kind (``limited``,
``rated`` and ``fair`` spread over 100 limit keys: a concurrency limit of 1000 each, a rate of
1000/s with a burst of 5, fair share), then times ``--claims`` claims of one task and of ten
by one expert (the first 50 left out: the pool's connections prepare their statements) and
50 peeks, and prints the median and the 90th percentile. Run it with ``PYTHONPATH`` pointing
at two checkouts to compare them (a checkout that does not keep a kind refuses it).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from contend.domain.limits import Rate
from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import ExpertInfo
from contend.store.postgres import PostgresStore
from contend.testing.postgres import fresh_database


def spec(kind: str, n: int) -> TaskSpec:
    key = f"k{n % 100}"
    if kind == "limited":
        return TaskSpec.build("t", [n], limit_key=key, concurrency_limit=1000)
    if kind == "rated":
        return TaskSpec.build("t", [n], limit_key=key, rate_limit=Rate.of("1000/s", 5))
    if kind == "fair":
        return TaskSpec.build("t", [n], limit_key=key, fair=True)
    return TaskSpec.build("t", [n])


def figures(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    return f"{name} median {statistics.median(ms):.2f} ms, p90 {ms[int(len(ms) * 0.9)]:.2f} ms"


async def run(kind: str, tasks: int, claims: int) -> None:
    async with fresh_database() as url:
        store = PostgresStore(url)
        await store.open()
        for first in range(0, tasks, 1000):
            await store.submit([spec(kind, n) for n in range(first, min(tasks, first + 1000))])
        session = await store.register_expert(ExpertInfo("bench"), 3600.0)
        for limit in (1, 10):
            took = []
            for _ in range(claims):
                t = time.perf_counter()
                got = await store.claim(
                    "bench", session, ["default"], Capabilities(), limit=limit, lease_ttl=3600
                )
                took.append((time.perf_counter() - t) * 1000)
                assert got, "the backlog ran out"
            looked = []
            for _ in range(50):
                t = time.perf_counter()
                await store.peek(["default"], Capabilities(), limit)
                looked.append((time.perf_counter() - t) * 1000)
            print(
                f"{kind}, limit {limit}: {figures('claim', took[50:])}; {figures('peek', looked)}"
            )
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("plain", "limited", "rated", "fair"), default="plain")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(run(args.kind, args.tasks, args.claims))


if __name__ == "__main__":
    main()
