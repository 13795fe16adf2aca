"""``contend expert``: run one expert until SIGTERM or SIGINT (a second signal stops it now)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from contend.cli.common import (
    Subcommands,
    UsageError,
    add_store_option,
    int_in,
    load_app,
    load_callable,
    positive_int,
    resolve_store_url,
    seconds,
)
from contend.domain.task import Capabilities
from contend.errors import TaskError

log = logging.getLogger("contend.cli")


def add_parser(sub: Subcommands) -> None:
    e = sub.add_parser("expert", help="run an expert until SIGTERM")
    e.add_argument("app", help="MODULE:APP")
    add_store_option(e)
    e.add_argument("--name", help="expert id (default host-pid); must not be live elsewhere")
    e.add_argument("--concurrency", "-c", type=positive_int("--concurrency", 10_000), default=8)
    e.add_argument("--capability", action="append", metavar="TAG|NAME=AMOUNT")
    e.add_argument("--queue", "-q", action="append", metavar="QUEUE")
    e.add_argument(
        "--lease",
        type=seconds("--lease", 0.5, 86_400),
        default=15.0,
        help="lease TTL in seconds (default 15)",
    )
    e.add_argument(
        "--grace",
        type=seconds("--grace", 0, 86_400),
        default=30.0,
        help="seconds running tasks get to finish on SIGTERM (default 30)",
    )
    e.add_argument("--tier", choices=["general", "specialized", "emergency"], default="general")
    e.add_argument("--specialty", action="append", metavar="TASK_TYPE")
    e.add_argument(
        "--window",
        type=seconds("--window", 0, 60),
        default=0.02,
        help="base race window in seconds (default 0.02; 0 turns competition off)",
    )
    e.add_argument(
        "--fitness",
        metavar="MODULE:FUNCTION",
        help="a custom fitness function (expert view, task view) -> [0, 1]",
    )
    e.add_argument(
        "--prefetch",
        type=int_in("--prefetch", 0, 10_000),
        default=0,
        help="claim this many tasks ahead, unstarted; idle experts may steal them (default 0)",
    )
    e.add_argument(
        "--steal-ratio",
        type=seconds("--steal-ratio", 0.01, 1.0),
        default=1.0,
        help="steal unstarted tasks from experts at least this loaded (default 1.0: full)",
    )
    e.add_argument(
        "--no-steal", action="store_true", help="never take unstarted tasks from other experts"
    )
    e.add_argument(
        "--auction-window",
        type=seconds("--auction-window", 0, 60),
        default=0.2,
        help="how long an auction for a heavy task takes bids (default 0.2 s)",
    )
    e.add_argument(
        "--zone-margin",
        type=seconds("--zone-margin", 0, 60),
        default=0.0,
        help="extra race delay for tasks that prefer tags (a zone) this expert lacks",
    )
    e.set_defaults(func=cmd_expert)


async def cmd_expert(args: argparse.Namespace) -> int:
    from contend.runtime.config import ExpertConfig
    from contend.runtime.expert import Expert

    app = load_app(args.app)
    url = resolve_store_url(args, app)
    app.with_store(url)
    try:
        caps = Capabilities.parse(args.capability or [])
    except TaskError as exc:
        raise UsageError(str(exc)) from exc
    config = ExpertConfig(
        name=args.name,
        concurrency=args.concurrency,
        queues=args.queue or None,
        capabilities=caps,
        lease_ttl=args.lease,
        grace=args.grace,
        tier=args.tier,
        specialties=frozenset(args.specialty or ()),
        window=args.window,
        zone_margin=args.zone_margin,
        prefetch=args.prefetch,
        steal_ratio=None if args.no_steal else args.steal_ratio,
        auction_window=args.auction_window,
    )
    if args.fitness:
        config.fitness = load_callable(args.fitness, "--fitness")
    expert = Expert(app, config)
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info(
                "signal %s: stopping gracefully (again to stop now)", signal.Signals(signum).name
            )
            expert.stop()
        else:
            log.warning("second signal: stopping now")
            expert.config.grace = 0
            expert.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await expert.run()
    finally:
        await app.aclose()
    return 0
