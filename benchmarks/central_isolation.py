"""Does a central queue's backlog slow claims elsewhere? Compete claims beside 100,000 pending
central tasks, on SQLite, etcd or PostgreSQL.

``python -m benchmarks.central_isolation [--backend sqlite|etcd|postgresql] [--backlog 100000]
[--claims 300] [--no-write]``
times claims of one task then its completion by a probe session, each a fresh task of a
compete queue (``default``), first with no central backlog, then with *backlog* pending tasks
in the central queue ``c``: a claim of the compete queue alone, and a claim of both queues at
once (what an expert serving both sends). It also times what the central queue itself costs
then: the leader's read of the tasks needing an assignee, and an assignee's claim of the task
a leader gave it; and at last compete claims in turns on the store with the backlog and on a
twin without one on the same server (less swayed by the machine's swings). Figures go to ``docs/central.json`` (SQLite) or ``docs/central_etcd.json``
(a throwaway etcd with ``--max-txn-ops=1024``, as the other etcd benchmarks run it) or
``docs/central_postgresql.json`` (a fresh database of the server ``CONTEND_TEST_PG`` names, one
schema a store; the table ANALYZEd after the fill, see :func:`analyze`); ``--no-write`` skips
that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from benchmarks import commit
from contend.domain.task import Capabilities, TaskSpec
from contend.store.port import CentralDispatch, Completion, ExpertInfo, Store
from contend.store.registry import open_store

ROOT = Path(__file__).resolve().parent.parent


def ms(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
    }


async def timed(n: int, step: Callable[[], Awaitable[None]]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await step()
        out.append(time.perf_counter() - t0)
    return out


async def compete_claims(store: Store, session: str, queues: list[str], n: int) -> list[float]:
    await store.submit([TaskSpec.build("job", [i]) for i in range(n)])

    async def step() -> None:
        (got,) = await store.claim("probe", session, queues, Capabilities(), limit=1, lease_ttl=60)
        await store.complete("probe", [Completion(got.id, got.fence, "null")])

    return await timed(n, step)


async def fill(store: Store, backlog: int) -> None:
    for start in range(0, backlog, 10_000):
        await store.submit(
            [
                TaskSpec.build("job", [i], queue="c", central=True)
                for i in range(start, min(backlog, start + 10_000))
            ]
        )


async def central_costs(store: Store, session: str, n: int) -> dict[str, Any]:
    assert isinstance(store, CentralDispatch)
    d = store
    term = await d.lead("probe", session, "queue:c", 60)
    assert term is not None
    reads = await timed(n, lambda: _read(d))

    async def given() -> None:
        (view,) = (await d.central_backlog(["c"], ["probe"], 1)).unassigned
        assert await d.assign("probe", session, "queue:c", term, {view.id: "probe"}) == 1
        t0 = time.perf_counter()
        (got,) = await store.claim("probe", session, ["c"], Capabilities(), limit=1, lease_ttl=60)
        claims.append(time.perf_counter() - t0)
        await store.complete("probe", [Completion(got.id, got.fence, "null")])

    claims: list[float] = []
    await timed(n, given)
    return {"leader_read": ms(reads), "assignee_claim": ms(claims)}


async def _read(d: CentralDispatch) -> None:
    await d.central_backlog(["c"], ["probe"], 100)


@asynccontextmanager
async def store_urls(backend: str) -> AsyncIterator[Callable[[str], str]]:
    """Makes the URL of a fresh store of *backend* by name (a file of one directory, a prefix
    of one etcd server), all removed afterwards."""
    if backend == "etcd":
        from contend.testing.etcd_server import EtcdServer

        server = EtcdServer(extra_args=["--max-txn-ops=1024"])
        server.start()
        try:
            yield lambda name: f"{server.url}/{name}?max_txn_ops=1024"
        finally:
            server.close()
    elif backend == "postgresql":
        from contend.testing.postgres import fresh_database

        async with fresh_database() as url:
            yield lambda name: f"{url}?schema={name}"
    elif backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield lambda name: f"sqlite:///{Path(tmp) / name}.db"
    else:
        raise SystemExit(f"unknown backend {backend!r} (sqlite, etcd, postgresql)")


async def analyze(url: str) -> None:
    """ANALYZE the tasks table, as autovacuum does soon after a large submit. Until then the
    statements a connection prepared while the table was small keep their plans (PostgreSQL
    plans a prepared statement again only when the table's statistics change), and some of
    those read the whole table: 25-80 ms claims and completions behind 100,000 pending
    tasks of any kind, plain ones too."""
    import psycopg

    from contend.store.postgres.url import parse_postgres_url

    dsn, opts = parse_postgres_url(url)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f'ANALYZE "{opts["schema"]}".tasks')


async def interleaved(stores: Sequence[tuple[Store, str]], n: int) -> list[list[float]]:
    """Compete claims on each of *stores* (store, session) in turns, ten blocks each, so that
    the machine's swings fall on all of them alike."""
    out: list[list[float]] = [[] for _ in stores]
    for _ in range(10):
        for samples, (store, session) in zip(out, stores, strict=True):
            samples += await compete_claims(store, session, ["default"], max(1, n // 10))
    return out


async def run(backend: str, backlog: int, n: int) -> dict[str, Any]:
    async with store_urls(backend) as url_of:
        store = await open_store(url_of("central"))
        twin = await open_store(url_of("twin"))  # the same server, no central backlog
        try:
            session = await store.register_expert(
                ExpertInfo("probe", queues=("default", "c")), 3600
            )
            base = await compete_claims(store, session, ["default"], n)
            t0 = time.perf_counter()
            await fill(store, backlog)
            filled = time.perf_counter() - t0
            if backend == "postgresql":
                await analyze(url_of("central"))
            alone = await compete_claims(store, session, ["default"], n)
            both = await compete_claims(store, session, ["default", "c"], n)
            costs = await central_costs(store, session, n)
            twin_session = await twin.register_expert(
                ExpertInfo("probe", queues=("default",)), 3600
            )
            beside, without = await interleaved([(store, session), (twin, twin_session)], n)
        finally:
            await store.close()
            await twin.close()
    return {
        "commit": commit(),
        "backend": backend,
        "backlog": backlog,
        "claims": n,
        "submit_backlog_s": round(filled, 2),
        "compete_claim_no_backlog": ms(base),
        "compete_claim_with_backlog": ms(alone),
        "both_queues_claim_with_backlog": ms(both),
        **costs,
        # in turns with a store of the same server that has no backlog (the fairer test)
        "interleaved_with_backlog": ms(beside),
        "interleaved_no_backlog": ms(without),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "etcd", "postgresql"], default="sqlite")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.backend, args.backlog, args.claims))
    print(json.dumps(report, indent=2))
    if not args.no_write:
        name = "central.json" if args.backend == "sqlite" else f"central_{args.backend}.json"
        (ROOT / "docs" / name).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
