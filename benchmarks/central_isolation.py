"""Does a central queue's backlog slow claims elsewhere? Compete claims beside 100,000 pending
central tasks, on SQLite.

``python -m benchmarks.central_isolation [--backlog 100000] [--claims 300] [--no-write]``
times claims of one task then its completion by a probe session, each a fresh task of a
compete queue (``default``), first with no central backlog, then with *backlog* pending tasks
in the central queue ``c``: a claim of the compete queue alone, and a claim of both queues at
once (what an expert serving both sends). It also times what the central queue itself costs
then: the leader's read of the tasks needing an assignee, and an assignee's claim of the task
a leader gave it. Figures go to ``docs/central.json`` (``--no-write`` skips that).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
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


async def run(backlog: int, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(f"sqlite:///{Path(tmp) / 'central.db'}")
        try:
            session = await store.register_expert(
                ExpertInfo("probe", queues=("default", "c")), 3600
            )
            base = await compete_claims(store, session, ["default"], n)
            t0 = time.perf_counter()
            await fill(store, backlog)
            filled = time.perf_counter() - t0
            alone = await compete_claims(store, session, ["default"], n)
            both = await compete_claims(store, session, ["default", "c"], n)
            costs = await central_costs(store, session, n)
        finally:
            await store.close()
    return {
        "commit": commit(),
        "backend": "sqlite",
        "backlog": backlog,
        "claims": n,
        "submit_backlog_s": round(filled, 2),
        "compete_claim_no_backlog": ms(base),
        "compete_claim_with_backlog": ms(alone),
        "both_queues_claim_with_backlog": ms(both),
        **costs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.backlog, args.claims))
    print(json.dumps(report, indent=2))
    if not args.no_write:
        (ROOT / "docs" / "central.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
