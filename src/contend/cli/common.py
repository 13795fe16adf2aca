"""What every ``contend`` command shares: argument types, loading the app, finding the store,
and printing tables, ages and JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn, TypeAlias, TypeVar

from contend.domain.payload import check_queue, parse_json, text_problem
from contend.errors import ConfigError, ContendError, TaskError, clip, shown, shown_url
from contend.runtime.app import App, choose_store
from contend.runtime.config import Bounds
from contend.store.port import Store

log = logging.getLogger("contend.cli")

# What ``add_subparsers()`` returns: each command module adds its parser to it.
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"
N = TypeVar("N", int, float)


class UsageError(ConfigError):
    """Bad command-line input."""


# A run of characters long enough to be a user's value echoed whole (a name, a URL, a path).
_LONG_WORD = re.compile(r"\S{100,}")


def clip_long_words(message: str) -> str:
    """*message* with every very long word cut short: the last guard against an error message
    that echoes a 100 KB value (messages of our own echo values through ``shown``)."""
    return _LONG_WORD.sub(lambda m: clip(m.group()), message)


class Parser(argparse.ArgumentParser):
    """argparse, whose own messages (an invalid choice, say) echo no value whole."""

    def error(self, message: str) -> NoReturn:
        super().error(clip_long_words(message))


# -- argument types: each refuses bad input with a message naming the option -------------------
def bounded(name: str, kind: Callable[[str], N], bounds: Bounds | None) -> Callable[[str], N]:
    """Parse an option's text as ``int`` or ``float`` and hold it to ``bounds``."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {shown(text)}") from None
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


def json_arg(name: str, kind: type | tuple[type, ...]) -> Callable[[str], Any]:
    """A JSON option (``--args '[1, 2]'``), or ``@FILE`` for the JSON in a file (``@-``: stdin)."""

    def parse(text: str) -> Any:
        what = name
        if text.startswith("@"):
            what = f"{name} file {shown(text[1:])}"
            text = _read_text(text[1:], name)
        try:
            value = parse_json(text, what)
        except TaskError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            want = " or ".join("array" if k is list else "object" for k in kinds)
            raise argparse.ArgumentTypeError(
                f"{what} must be a JSON {want}, got {shown(text.strip())}"
            )
        return value

    return parse


def _read_text(path: str, name: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{name}: cannot read {shown(path)}: {exc.strerror}"
        ) from None
    except UnicodeDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{name}: {shown(path)} is not UTF-8 (byte {exc.start + 1}); save it as UTF-8"
        ) from None


def text_arg(name: str) -> Callable[[str], str]:
    """A free-text option or argument (a URL, an id): not empty, and valid Unicode without
    control characters (a byte that is not UTF-8 reaches Python as a lone surrogate)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{name} is empty")
        problem = text_problem(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{name} {problem}: {shown(text)}")
        return text

    return parse


def queue_arg() -> Callable[[str], str]:
    """A queue name, held to the rule of every submission (``check_queue``)."""

    def parse(text: str) -> str:
        try:
            return check_queue(text)
        except TaskError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        type=text_arg("--store"),
        help="store URL (default: $CONTEND_STORE, then the app's)",
    )


def add_read_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that reads a store: ``--store``, ``--app``, ``--json``."""
    add_store_option(parser)
    parser.add_argument("--app", help="MODULE:APP whose store to use")
    parser.add_argument("--json", action="store_true")


# -- the app and the store -----------------------------------------------------------------
def import_module(name: str, failure: str) -> Any:
    """Import module *name* (the current directory is importable); a UsageError that starts
    with *failure* when it cannot be."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise UsageError(f"{failure} {shown(name)}: {clip(str(exc))}") from exc
    except TypeError as exc:  # a relative name such as '.tasks'
        if not name.startswith("."):
            raise UsageError(f"{failure} {shown(name)}: {_raised(exc)}") from exc
        raise UsageError(f"{failure} {shown(name)}: a module name cannot be relative") from exc
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}" if exc.filename else "?"
        raise UsageError(
            f"{failure} {shown(name)}: SyntaxError: {exc.msg} ({where}); fix it and run again"
        ) from exc
    except ContendError:
        raise  # a bad @app.task and the like say what is wrong themselves
    except Exception as exc:  # the module raised while it was imported
        raise UsageError(f"{failure} {shown(name)}: {_raised(exc)}") from exc


def _raised(exc: BaseException) -> str:
    """An exception a module raised at import, with where: one line."""
    stdlib = sysconfig.get_paths()["stdlib"]
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<", stdlib))  # the user's code, not importlib or os
    ]
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"importing it raised {type(exc).__name__}: {clip(str(exc))}{where}"


def load_app(target: str) -> App:
    """Import ``module:attribute`` (the current directory is importable) and return the App."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(
            f"an app is named MODULE:ATTRIBUTE (e.g. myproject.tasks:app), got {shown(target)}"
        )
    module = import_module(module_name, "cannot import module")
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise UsageError(f"{shown(target)} is not a contend App (got {type(app).__name__})")
    return app


def load_callable(target: str, option: str) -> Callable[..., Any]:
    """Import ``module:function`` for an option such as ``--fitness``."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{option} takes MODULE:FUNCTION, got {shown(target)}")
    module = import_module(module_name, f"{option}: cannot import module")
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{option}: {shown(target)} is not a function")
    return fn  # type: ignore[no-any-return]


def resolve_store_url(args: argparse.Namespace, app: App | None = None) -> str:
    """The store a command uses, by the one rule (``contend.runtime.app.choose_store``):
    ``--store``, else the app's ``App(url)``, else ``CONTEND_STORE``. A ``CONTEND_STORE`` that
    names another store is said to be ignored."""
    try:
        choice = choose_store(getattr(args, "store", None), app._url if app is not None else None)
    except ConfigError:
        raise UsageError(
            "no store: pass --store URL, set CONTEND_STORE, or give an app that has one"
        ) from None
    if choice.ignored is not None:
        log.warning(
            "CONTEND_STORE (%s) is ignored: %s names the store %s",
            shown_url(choice.ignored),
            choice.source,
            shown_url(choice.url),
        )
    return choice.url


async def with_store(
    args: argparse.Namespace, fn: Callable[[Store], Coroutine[Any, Any, int]]
) -> int:
    """Open the store that ``--store``/``--app`` name, run ``fn`` on it, close it. These
    commands read or manage what is there: a store that does not exist yet is not created
    (a 0-byte file stays 0 bytes), it is refused with SchemaError."""
    return await with_app_store(args, lambda store, _app: fn(store))


async def with_app_store(
    args: argparse.Namespace, fn: Callable[[Store, App | None], Coroutine[Any, Any, int]]
) -> int:
    """:func:`with_store` for a command that also reads the ``--app`` it was given (None
    without one): ``status`` shows that app's pipelines."""
    from contend.store.registry import open_store

    app = load_app(args.app) if getattr(args, "app", None) else None
    store = await open_store(resolve_store_url(args, app), create=False)
    try:
        return await fn(store, app)
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
