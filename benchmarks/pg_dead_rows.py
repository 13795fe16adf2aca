"""Claim latency on PostgreSQL behind the dead row versions a long transaction keeps.

``python -m benchmarks.pg_dead_rows [--tasks 45000] [--lane 0|1] [--no-hold]`` fills a fresh
database (``contend.testing.postgres.fresh_database``) with ``--tasks`` pending no-op tasks,
opens a second connection that runs ``BEGIN; SELECT txid_current();`` and stays idle in that
transaction (``--no-hold``: it does not), then claims and completes tasks with one store,
timing 30 claims of 8 (each completed at once, the completion not timed) after 0, 2,000, 5,000, 10,000, 20,000 and
40,000 tasks are done. ``--lane 1`` gives each timed claim one low-lane slot, as an expert's
claims mostly have. Prints the median and the 90th percentile at each mark.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import psycopg

from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import Completion, ExpertInfo
from contend.store.postgres import PostgresStore
from contend.testing.postgres import fresh_database

MARKS = (0, 2_000, 5_000, 10_000, 20_000, 40_000)


async def run(tasks: int, lane: int, hold: bool) -> None:
    async with fresh_database() as url:
        store = PostgresStore(url)
        await store.open()
        for first in range(0, tasks, 1000):
            await store.submit(
                [TaskSpec.build("t", [n]) for n in range(first, min(tasks, first + 1000))]
            )
        session = await store.register_expert(ExpertInfo("bench"), 3600.0)
        holder = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await holder.execute("ANALYZE")
        if hold:
            await holder.execute("BEGIN")
            await holder.execute("SELECT txid_current()")

        async def claim(limit: int, low_lane: int = 0, times: list[float] | None = None) -> int:
            began = time.perf_counter()
            got = await store.claim(
                "bench",
                session,
                ["default"],
                Capabilities(),
                limit=limit,
                lease_ttl=3600,
                low_lane=low_lane,
            )
            if times is not None:
                times.append((time.perf_counter() - began) * 1000)
            await store.complete("bench", [Completion(c.id, c.fence, "1") for c in got])
            return len(got)

        done, marks = 0, [m for m in MARKS if m < tasks - 300]
        while marks:
            if done < marks[0]:
                done += await claim(50)
                continue
            marks.pop(0)
            took: list[float] = []
            for _ in range(30):
                done += await claim(8, lane, took)
            took.sort()
            print(
                f"hold={hold} lane={lane} after {done:>6,} done: claim of 8 median "
                f"{statistics.median(took):.2f} ms, p90 {took[27]:.2f} ms",
                flush=True,
            )
        await holder.close()
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=45_000)
    parser.add_argument("--lane", type=int, choices=(0, 1), default=0)
    parser.add_argument("--no-hold", dest="hold", action="store_false")
    args = parser.parse_args()
    asyncio.run(run(args.tasks, args.lane, args.hold))


if __name__ == "__main__":
    main()
