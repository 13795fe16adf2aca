"""``contend prune``: delete finished tasks older than an age, in bounded passes."""

from __future__ import annotations

import argparse
import re
import sys
import time

from contend.cli.common import Subcommands, add_store_option, with_store
from contend.domain.retention import (
    DEFAULT_BATCH,
    DEFAULT_KEEP_EVENTS,
    MAX_BATCH,
    check_retention,
)
from contend.errors import ConfigError
from contend.store.port import Store

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w`` as seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not an age: give a number with s, m, h, d or w (e.g. 7d)"
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def add_parser(sub: Subcommands) -> None:
    pr = sub.add_parser(
        "prune",
        help="delete finished tasks older than an age (with their history and results)",
        description="Delete succeeded, failed, dead and cancelled tasks last changed longer "
        "ago than --older-than, whole (history, payload, result), in passes of --batch "
        "tasks, until none is left; cap every task's history at --keep-events lines. A "
        "dependency that a waiting task still waits on is kept. Experts also prune as they "
        "go (--retention of `contend expert`).",
    )
    add_store_option(pr)
    pr.add_argument("--app", help="MODULE:APP whose store to use")
    pr.add_argument(
        "--older-than",
        type=duration,
        required=True,
        metavar="AGE",
        help="finished longer ago than this: 90s, 15m, 12h, 7d, 2w",
    )
    pr.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help=f"tasks per pass (1 to {MAX_BATCH:,})"
    )
    pr.add_argument(
        "--keep-events",
        type=int,
        default=DEFAULT_KEEP_EVENTS,
        help="history lines kept per task: the first and the newest",
    )
    pr.set_defaults(func=cmd_prune)


async def cmd_prune(args: argparse.Namespace) -> int:
    age = check_retention(args.older_than)
    assert age is not None
    if not 1 <= args.batch <= MAX_BATCH:
        raise ConfigError(f"--batch must be from 1 to {MAX_BATCH:,}, not {args.batch}")
    if args.keep_events < 1:
        raise ConfigError(f"--keep-events must be at least 1, not {args.keep_events}")

    async def run(store: Store) -> int:
        before = await store.now() - age
        total, began = 0, time.monotonic()
        tty = sys.stderr.isatty()
        while True:
            n = await store.prune(before, args.batch, keep_events=args.keep_events)
            total += n
            if tty:
                print(f"\rpruned {total:,} task(s)…", end="", file=sys.stderr, flush=True)
            if n == 0:
                break
        if tty:
            print("\r", end="", file=sys.stderr)
        took = time.monotonic() - began
        print(f"pruned {total:,} finished task(s) older than {args.older_than:g}s in {took:.1f}s")
        return 0

    return await with_store(args, run)
