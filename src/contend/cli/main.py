"""``contend``: run experts, submit and manage tasks, show status, run the demo and benchmarks.

Each command lives in a module of its own (``expert``, ``supervise``, ``submit``, ``tasks``,
``status``, ``migrate``, ``demo``, ``bench``); this module assembles their parsers and runs one.

Exit codes: 0 success, 1 failure at run time, 2 bad input or an operation the task's state
refuses (nothing was changed), 141 when the reader of the output went away (``| head``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from contend import __version__
from contend.cli import (
    completion,
    dashboard,
    expert,
    migrate,
    prune,
    status,
    submit,
    supervise,
    tasks,
)
from contend.cli.common import (
    Parser,
    Subcommands,
    UsageError,
    bounded,
    clip_long_words,
    int_in,
    int_list,
    load_app,
    load_callable,
    positive_int,
    resolve_store_url,
    text_arg,
)
from contend.errors import ConfigError, ContendError, InvalidTransition, SchemaError, TaskError

__all__ = ["UsageError", "build_parser", "load_app", "load_callable", "main", "resolve_store_url"]

log = logging.getLogger("contend.cli")


# -- demo and bench: their modules load workloads, so they are imported only when run ------------
async def cmd_demo(args: argparse.Namespace) -> int:
    if args.pipeline:
        from contend.cli.demo_pipeline import run_pipeline_demo

        return await run_pipeline_demo(args)
    from contend.cli.demo import run_demo

    return await run_demo(args)


async def cmd_bench(args: argparse.Namespace) -> int:
    from contend.cli.bench import run_bench

    return await run_bench(args)


def _add_demo(sub: Subcommands) -> None:
    d = sub.add_parser("demo", help="a live demo: experts, a workload, a crash, a report")
    d.add_argument(
        "--store",
        type=text_arg("--store"),
        help="store URL (default: a new SQLite file in a temp dir)",
    )
    d.add_argument("--tasks", type=positive_int("--tasks", 1_000_000), default=3000)
    d.add_argument("--experts", type=int_in("--experts", 2, 32), default=4)
    d.add_argument("--no-kill", action="store_true", help="do not kill an expert")
    window, setting = expert.option("window")  # passed on to the experts: their default, bounds
    d.add_argument(
        "--window",
        type=bounded("--window", float, setting.bounds),
        default=window.default,
        help="the experts' base race window (0 turns competition off, for comparison)",
    )
    d.add_argument("--json", action="store_true", help="print the closing report as JSON")
    d.add_argument(
        "--pipeline",
        action="store_true",
        help="the pipeline demo: log lines through extract, transform, load into SQLite",
    )
    d.add_argument(
        "--lines",
        type=int_in("--lines", 1000, 100_000_000),
        default=1_000_000,
        help="with --pipeline: how many log lines (default 1,000,000)",
    )
    d.set_defaults(func=cmd_demo)


def _add_bench(sub: Subcommands) -> None:
    b = sub.add_parser(
        "bench", help="measure throughput, latency and memory; write docs/benchmarks.md"
    )
    b.add_argument(
        "--store", type=text_arg("--store"), help="store URL (default: SQLite files in a temp dir)"
    )
    b.add_argument("--tasks", type=positive_int("--tasks", 10_000_000), default=20_000)
    b.add_argument("--out", default="docs/benchmarks.md")
    b.add_argument("--quick", action="store_true", help="a small run, for a smoke test")
    b.add_argument(
        "--processes",
        type=int_list("--processes"),
        default=[1, 2],
        help="expert process counts to drain with, e.g. 1,2,4 (default 1,2)",
    )
    b.add_argument(
        "--concurrency",
        type=positive_int("--concurrency", 10_000),
        default=32,
        help="each bench expert's concurrency (default 32)",
    )
    b.add_argument(
        "--body",
        choices=["async", "sync"],
        default="async",
        help="the no-op tasks as coroutine functions or as plain functions (default async)",
    )
    b.set_defaults(func=cmd_bench)


# -- parser --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="contend",
        description="Decentralized task scheduling by competition and claim.",
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("CONTEND_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    p.add_argument("--log-json", action="store_true", help="structured JSON log lines")
    p.add_argument("--version", action="version", version=f"contend {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        expert.add_parser,
        supervise.add_parser,
        submit.add_parser,
        tasks.add_parser,
        status.add_parser,
        migrate.add_parser,
        prune.add_parser,
        dashboard.add_parser,
        _add_demo,
        _add_bench,
        completion.add_parser,
    ):
        add(sub)
    return p


# -- logging and main ----------------------------------------------------------------------
#: The fields a log line about a task carries (``contend.runtime.hooks.task_fields``).
TASK_LOG_FIELDS = ("task_id", "task_type", "expert", "fence", "attempt")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        for name in TASK_LOG_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        return json.dumps(line)


def configure_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger("contend")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    # The pool says "error connecting" at each of its tries; the store says it once, itself.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


def _fail(message: str, code: int) -> NoReturn:
    print(f"contend: error: {clip_long_words(message)}", file=sys.stderr)
    raise SystemExit(code)


def _reader_left() -> int:
    """The reader of our output went away (``contend tasks list | head``): stop quietly, as
    any Unix tool does, and keep Python from complaining when it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a tool the pipe stopped


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_json)
    started = time.monotonic()
    try:
        code = asyncio.run(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_left()
    except (ConfigError, TaskError, SchemaError, InvalidTransition) as exc:
        _fail(str(exc), 2)
    except ContendError as exc:
        _fail(str(exc), 1)
    log.debug("%s took %.3fs", args.command, time.monotonic() - started)
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
