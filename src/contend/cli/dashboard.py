"""``contend dashboard``: the web dashboard over a store (needs the ``dashboard`` extra)."""

from __future__ import annotations

import argparse
import os

from contend.cli.common import Subcommands, add_store_option, int_in, text_arg, with_store
from contend.store.port import Store


def add_parser(sub: Subcommands) -> None:
    d = sub.add_parser("dashboard", help="a web dashboard: experts, queues, tasks, live numbers")
    add_store_option(d)
    d.add_argument("--app", help="MODULE:APP whose store to use")
    d.add_argument(
        "--host",
        type=text_arg("--host"),
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1; any other needs --token)",
    )
    d.add_argument("--port", type=int_in("--port", 0, 65535), default=8765)
    d.add_argument(
        "--token",
        type=text_arg("--token"),
        help="a token the dashboard asks for (default: $CONTEND_DASHBOARD_TOKEN)",
    )
    d.add_argument(
        "--root-path",
        default="",
        metavar="PREFIX",
        help="the path a reverse proxy serves it under, like /contend (default: none); its "
        "links carry it, and it answers paths with or without it",
    )
    d.set_defaults(func=cmd_dashboard)


async def cmd_dashboard(args: argparse.Namespace) -> int:
    from contend.dashboard import ENV_TOKEN, check_bind, check_root_path, serve

    token = args.token or os.environ.get(ENV_TOKEN) or None
    check_bind(args.host, token)  # before the store is opened
    root = check_root_path(args.root_path, "--root-path")

    async def run(store: Store) -> int:
        await serve(store, host=args.host, port=args.port, token=token, root_path=root)
        return 0

    return await with_store(args, run)
