"""The sustained-load run for PgQueuer (bench virtualenv), to compare with contend's.

``python -m benchmarks.sustained.pgqueuer_load [--rate 1000] [--duration 600] [--hold]
[--tail 60]``: a fresh PostgreSQL database, PgQueuer's schema, two worker processes at its
defaults (those of :mod:`benchmarks.peers.peer_systems`), the producer enqueuing each tick's
``stamp`` jobs in one ``Queries.enqueue`` call. Progress on stderr, one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from benchmarks.peers.common import fresh_pg_database, pg_tables_size, print_result
from benchmarks.peers.peer_child import Workers
from benchmarks.peers.peer_systems import PgQueuer
from benchmarks.sustained.driver import Plan, System, plan_arguments, plan_of, run


async def load(dsn: str, plan: Plan) -> dict[str, Any]:
    peer = PgQueuer(dsn)
    await peer.open()
    await peer.setup()
    workers = Workers("pgqueuer", dsn, peer.processes)

    async def start() -> None:
        await workers.start()
        workers.go()

    async def size() -> int:
        return await asyncio.to_thread(pg_tables_size, dsn)

    system = System("pgqueuer", start, peer.submit_many, size, workers.stop, dsn)
    try:
        return await run(system, plan)
    finally:
        await peer.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sustained.pgqueuer_load")
    plan_arguments(parser)
    args = parser.parse_args()

    async def child() -> dict[str, Any]:
        with fresh_pg_database() as dsn:
            return await load(dsn, plan_of(args))

    print_result(asyncio.run(child()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
