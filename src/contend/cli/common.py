"""What every ``contend`` command shares: argument types, loading the app, finding the store,
and printing tables, ages and JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeAlias, TypeVar

from contend.errors import ConfigError
from contend.runtime.app import App
from contend.runtime.config import Bounds
from contend.store.port import Store

# What ``add_subparsers()`` returns: each command module adds its parser to it.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
N = TypeVar("N", int, float)


class UsageError(ConfigError):
    """Bad command-line input."""


# -- argument types: each refuses bad input with a message naming the option -------------------
def bounded(name: str, kind: Callable[[str], N], bounds: Bounds | None) -> Callable[[str], N]:
    """Parse an option's text as ``int`` or ``float`` and hold it to ``bounds``."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}") from None
        if bounds is not None and (not math.isfinite(value) or value not in bounds):
            raise argparse.ArgumentTypeError(f"{name} must be {bounds}, got {text}")
        return value

    return parse


def positive_int(name: str, hi: int) -> Callable[[str], int]:
    return int_in(name, 1, hi)


def int_in(name: str, lo: int, hi: int) -> Callable[[str], int]:
    return bounded(name, int, Bounds(lo, hi))


def seconds(name: str, lo: float, hi: float) -> Callable[[str], float]:
    return bounded(name, float, Bounds(lo, hi))


def int_list(name: str) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes integers like 1,2,4") from None
        if not values or any(not 1 <= v <= 64 for v in values):
            raise argparse.ArgumentTypeError(f"{name} takes 1 to 64 processes, like 1,2,4")
        return values

    return parse


def json_arg(name: str, kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{name} is not valid JSON: {exc}") from None
        if not isinstance(value, kind):
            want = "array" if kind is list else "object"
            raise argparse.ArgumentTypeError(f"{name} must be a JSON {want}, got {text!r}")
        return value

    return parse


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help="store URL (default: $CONTEND_STORE, then the app's)")


def add_read_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that reads a store: ``--store``, ``--app``, ``--json``."""
    add_store_option(parser)
    parser.add_argument("--app", help="MODULE:APP whose store to use")
    parser.add_argument("--json", action="store_true")


# -- the app and the store -----------------------------------------------------------------
def load_app(target: str) -> App:
    """Import ``module:attribute`` (the current directory is importable) and return the App."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"an app is named MODULE:ATTRIBUTE (e.g. myproject.tasks:app), got {target!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import module {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise UsageError(f"{target!r} is not a contend App (got {type(app).__name__})")
    return app


def load_callable(target: str, option: str) -> Callable[..., Any]:
    """Import ``module:function`` for an option such as ``--fitness``."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{option} takes MODULE:FUNCTION, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"{option}: cannot import module {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{option}: {target!r} is not a function")
    return fn  # type: ignore[no-any-return]


def resolve_store_url(args: argparse.Namespace, app: App | None = None) -> str:
    url: str | None = getattr(args, "store", None) or os.environ.get("CONTEND_STORE")
    if not url and app is not None:
        url = app._url
    if not url:
        raise UsageError(
            "no store: pass --store URL, set CONTEND_STORE, or give an app that has one"
        )
    return url


async def with_store(
    args: argparse.Namespace, fn: Callable[[Store], Coroutine[Any, Any, int]]
) -> int:
    """Open the store that ``--store``/``--app`` name, run ``fn`` on it, close it."""
    from contend.store.registry import open_store

    app = load_app(args.app) if getattr(args, "app", None) else None
    store = await open_store(resolve_store_url(args, app))
    try:
        return await fn(store)
    finally:
        await store.close()


# -- output ----------------------------------------------------------------------------------
def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[[("" if c is None else str(c)) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m"
