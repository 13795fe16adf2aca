"""``contend status``: queue depths by state, the experts, throughput and competition; with
``--app``, each pipeline's stages, their backlog and rate."""

from __future__ import annotations

import argparse

from contend.cli.common import (
    Subcommands,
    add_read_options,
    age,
    print_json,
    table,
    with_app_store,
)
from contend.domain.task import JSON, TaskState
from contend.runtime.app import App
from contend.runtime.pipeline import StageStats, stage_stats
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

STAGE_COLUMNS = ["pipeline", "stage", "pending", "running", "done/min", "rate/s", "failed", "flow"]


def add_parser(sub: Subcommands) -> None:
    st = sub.add_parser(
        "status",
        help="queue depths, experts, throughput, competition (with --app: pipeline stages)",
    )
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


def _stages(app: App | None, stats: StoreStats) -> list[StageStats]:
    """Every stage of the app's pipelines (none without ``--app``: only the app knows which
    queues make a pipeline, and in what order)."""
    if app is None:
        return []
    return [s for _, p in sorted(app.pipelines.items()) for s in stage_stats(p, stats)]


def _stage_rows(stages: list[StageStats]) -> list[tuple[object, ...]]:
    return [
        (
            s.pipeline,
            s.stage,
            s.pending,
            s.running,
            s.done_last_minute,
            f"{s.rate:.2f}",
            s.failed,
            "held: next stage full" if s.held else "-",
        )
        for s in stages
    ]


def _pipelines_json(stages: list[StageStats]) -> dict[str, JSON]:
    out: dict[str, list[JSON]] = {}
    for s in stages:
        out.setdefault(s.pipeline, []).append(s.to_json())
    return dict(out)


async def cmd_status(args: argparse.Namespace) -> int:
    async def run(store: Store, app: App | None) -> int:
        stats = await store.stats()
        data = stats.to_json()
        stages = _stages(app, stats)
        if args.json:
            if app is not None:
                data["pipelines"] = _pipelines_json(stages)
            print_json(data)
            return 0
        states = [str(s) for s in TaskState]
        rows = [[q, *(c.get(s, 0) for s in states)] for q, c in sorted(stats.counts.items())]
        print("queues")
        print(table(rows, ["queue", *states]) if rows else "  (no tasks)")
        print()
        if stages:
            print("pipelines (rate: tasks done a second over the last minute)")
            print(table(_stage_rows(stages), STAGE_COLUMNS))
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

    return await with_app_store(args, run)
