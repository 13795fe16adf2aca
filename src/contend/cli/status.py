"""``contend status``: queue depths by state, the experts, throughput and competition."""

from __future__ import annotations

import argparse

from contend.cli.common import Subcommands, add_read_options, age, print_json, table, with_store
from contend.domain.task import TaskState
from contend.store.port import Store, StoreStats

EXPERT_COLUMNS = [
    "expert",
    "state",
    "tier",
    "load",
    "heartbeat",
    "tags",
    "done",
    "won",
    "lost",
    "success",
    "window",
]


def add_parser(sub: Subcommands) -> None:
    st = sub.add_parser("status", help="queue depths, experts, throughput, competition")
    add_read_options(st)
    st.set_defaults(func=cmd_status)


def _expert_rows(stats: StoreStats) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for e in stats.experts:
        m = e.metrics
        tier = e.info.tier
        if tier == "emergency":
            tier += " (on)" if m.get("active") else " (standby)"
        rows.append(
            (
                e.info.id,
                "live" if e.alive else "gone",
                tier,
                f"{e.load}/{e.info.capacity}",
                age(stats.now - e.heartbeat_at),
                ",".join(sorted(e.info.capabilities.tags)) or "-",
                e.tasks_done,
                e.claims_won,
                m.get("lost_races", e.claim_attempts - e.claims_won),
                f"{e.claims_won / e.claim_attempts:.0%}" if e.claim_attempts else "-",
                f"{float(m.get('window', 0)) * 1000:.0f}ms" if "window" in m else "-",
            )
        )
    return rows


async def cmd_status(args: argparse.Namespace) -> int:
    async def run(store: Store) -> int:
        stats = await store.stats()
        data = stats.to_json()
        if args.json:
            print_json(data)
            return 0
        states = [str(s) for s in TaskState]
        rows = [[q, *(c.get(s, 0) for s in states)] for q, c in sorted(stats.counts.items())]
        print("queues")
        print(table(rows, ["queue", *states]) if rows else "  (no tasks)")
        print()
        live = [e for e in stats.experts if e.alive]
        print(f"experts ({len(live)} live, {len(stats.experts) - len(live)} gone)")
        erows = _expert_rows(stats)
        if erows:
            print(table(erows, EXPERT_COLUMNS))
        comp = data["competition"]
        print()
        rate = comp["success_rate"]
        print(f"throughput (last minute): {data['throughput_per_s']:.1f} tasks/s")
        print(f"oldest pending: {age(stats.oldest_pending_age)}")
        print(
            f"competition success rate: {'-' if rate is None else f'{rate:.1%}'} "
            f"({comp['claims_won']} won of {comp['claim_attempts']} attempts)"
        )
        return 0

    return await with_store(args, run)
