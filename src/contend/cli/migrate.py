"""``contend migrate``: create a store's schema or bring it up to this contend's version."""

from __future__ import annotations

import argparse

from contend.cli.common import Subcommands, add_store_option, load_app, resolve_store_url


def add_parser(sub: Subcommands) -> None:
    mg = sub.add_parser("migrate", help="create or upgrade the store's schema (PostgreSQL)")
    add_store_option(mg)
    mg.add_argument("--app", help="MODULE:APP whose store to use")
    mg.set_defaults(func=cmd_migrate)


async def cmd_migrate(args: argparse.Namespace) -> int:
    """Create the store's schema or bring it up to this contend's version."""
    from contend.store.registry import make_store

    app = load_app(args.app) if getattr(args, "app", None) else None
    store = make_store(resolve_store_url(args, app))
    migrate = getattr(store, "migrate", None)
    if migrate is None:  # memory, SQLite: nothing versioned to upgrade by hand
        print(f"{store.url}: this backend has no schema migrations")
        return 0
    applied = await migrate()  # works without open(), which refuses an old schema
    print(f"applied schema version(s) {', '.join(map(str, applied))}" if applied else "up to date")
    return 0
