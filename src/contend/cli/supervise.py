"""``contend supervise -n N MODULE:APP [expert options]``: keep N experts alive on this host.

Each expert is a ``contend expert`` child process named ``{name}-{slot}``; one that dies is
replaced (with back-off when it keeps dying) and, since the supervisor sees it die at once, its
session is ended in the store so that its tasks are claimable again at once rather than after
the lease. SIGTERM or SIGINT drains every expert; a second signal stops them at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import Any

from contend.cli.common import (
    Subcommands,
    UsageError,
    add_store_option,
    int_in,
    load_app,
    resolve_store_url,
)
from contend.cli.expert import CONVERSIONS, add_config_options, config_from_args, options
from contend.domain.payload import check_name
from contend.errors import TaskError

log = logging.getLogger("contend.cli")


def add_parser(sub: Subcommands) -> None:
    s = sub.add_parser(
        "supervise",
        help="keep N experts alive on this host; a dead one's tasks are claimable at once",
    )
    s.add_argument("app", help="MODULE:APP")
    s.add_argument(
        "-n",
        "--experts",
        type=int_in("--experts", 1, 256),
        default=1,
        metavar="N",
        help="how many experts to keep alive (default: 1)",
    )
    add_store_option(s)
    add_config_options(s)  # passed on to every expert; --name is the base of their names
    s.add_argument(
        "--no-steal", action="store_true", help="never take unstarted tasks from other experts"
    )
    s.add_argument(
        "--no-periodic",
        action="store_true",
        help="do not submit the ticks of the app's periodic tasks (other experts do)",
    )
    s.set_defaults(func=cmd_supervise)


def expert_options(args: argparse.Namespace) -> list[str]:
    """The ``contend expert`` options that *args* gives, but ``--name`` (each child has its
    own): only those given, so a child's defaults are the expert's own."""
    out: list[str] = []
    for f, s in options():
        value: Any = getattr(args, f.name)
        assert s.flag is not None
        if f.name == "name" or value is None:
            continue
        if f.name not in CONVERSIONS and value == f.default:
            continue
        for item in value if s.repeat else [value]:
            out += [s.flag, str(item)]
    if args.no_steal:
        out.append("--no-steal")
    if args.no_periodic:
        out.append("--no-periodic")
    return out


def child_names(base: str | None, count: int) -> list[str]:
    base = base or f"{socket.gethostname()}-{os.getpid()}"
    names = [f"{base}-{n}" for n in range(count)]
    try:
        for name in names:
            check_name(name, "an expert name")
    except TaskError as exc:
        raise UsageError(f"--name: {exc}") from None
    return names


async def cmd_supervise(args: argparse.Namespace) -> int:
    from contend.runtime.supervisor import Supervisor
    from contend.store.registry import open_store

    app = load_app(args.app)
    url = resolve_store_url(args, app)
    if url.lower().startswith("memory:"):
        raise UsageError(
            "supervise runs experts in processes of their own, and a memory:// store lives "
            "in one process: give a SQLite, PostgreSQL or etcd store"
        )
    config = config_from_args(args)
    config.validate()  # refuse bad options here, not once per child
    if args.experts > 1 and not config.gossip_bind.endswith(":0"):
        raise UsageError(
            f"--gossip-bind {config.gossip_bind}: the {args.experts} experts cannot all bind "
            "one port; give port 0 (any free one), the default"
        )
    names = child_names(args.name, args.experts)
    head = [sys.executable, "-m", "contend", "--log-level", args.log_level]
    if args.log_json:
        head.append("--log-json")
    tail = ["--store", url, *expert_options(args)]

    def command(name: str) -> list[str]:
        return [*head, "expert", args.app, "--name", name, *tail]

    store = await open_store(url)
    log.info("supervisor: store %s", store.url)
    supervisor = Supervisor(store, names, command)
    loop = asyncio.get_running_loop()
    seen = 0

    def on_signal(signum: int) -> None:
        nonlocal seen
        seen += 1
        name = signal.Signals(signum).name
        if seen == 1:
            log.info("signal %s: draining every expert (again to stop them now)", name)
        else:
            log.warning("signal %s again: stopping every expert now", name)
        supervisor.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await supervisor.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await store.close()
