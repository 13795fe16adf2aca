"""``contend``: run experts, submit and manage tasks, show status, run the demo and benchmarks.

Exit codes: 0 success, 1 failure at run time, 2 bad input (nothing was changed).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

from contend.domain.task import Capabilities, TaskState
from contend.errors import ConfigError, ContendError, SchemaError, TaskError
from contend.runtime.app import App
from contend.store.port import Store

log = logging.getLogger("contend.cli")


class UsageError(ConfigError):
    """Bad command-line input."""


# -- argument helpers ----------------------------------------------------------------------
def _positive_int(name: str, hi: int) -> Callable[[str], int]:
    return _int_in(name, 1, hi)


def _seconds(name: str, lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(value) or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}, got {text}")
        return value

    return parse


def _int_in(name: str, lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be between {lo} and {hi}, got {value}")
        return value

    return parse


def _int_list(name: str) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes integers like 1,2,4") from None
        if not values or any(not 1 <= v <= 64 for v in values):
            raise argparse.ArgumentTypeError(f"{name} takes 1 to 64 processes, like 1,2,4")
        return values

    return parse


def _json_arg(name: str, kind: type) -> Callable[[str], Any]:
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


async def _open(url: str) -> Store:
    from contend.store.registry import open_store

    return await open_store(url)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[[("" if c is None else str(c)) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m"


# -- commands ------------------------------------------------------------------------------
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


def _read_batch(path: str) -> list[dict[str, Any]]:
    items = []
    allowed = {"args", "kwargs", "priority", "key", "delay", "queue", "requirements"}
    try:
        fh = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"cannot read batch file {path!r}: {exc.strerror}") from exc
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{path}:{n}: not valid JSON: {exc}") from exc
            if not isinstance(item, dict):
                raise TaskError(f"{path}:{n}: each line must be a JSON object")
            unknown = set(item) - allowed
            if unknown:
                raise TaskError(f"{path}:{n}: unknown field(s) {sorted(unknown)}")
            items.append(item)
    return items


async def cmd_submit(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    app.with_store(resolve_store_url(args, app))
    try:
        if args.batch:
            items = _read_batch(args.batch)
            specs = []
            for n, item in enumerate(items, 1):
                try:
                    specs.append(
                        app.build_spec(
                            args.task,
                            item.get("args", []),
                            item.get("kwargs"),
                            priority=item.get("priority"),
                            key=item.get("key"),
                            delay=item.get("delay", 0.0),
                            queue=item.get("queue"),
                            requirements=item.get("requirements"),
                        )
                    )
                except TaskError as exc:
                    raise TaskError(f"{args.batch}:{n}: {exc}") from exc
            handles = []
            for start in range(0, len(specs), 1000):
                handles += await app.submit_many(specs[start : start + 1000])
            if args.json:
                _print_json([{"id": h.id, "created": h.created} for h in handles])
            else:
                for h in handles:
                    print(h.id)
                print(
                    f"submitted {sum(h.created for h in handles)} task(s), "
                    f"{sum(not h.created for h in handles)} already present",
                    file=sys.stderr,
                )
            return 0
        spec = app.build_spec(
            args.task,
            args.args,
            args.kwargs,
            priority=args.priority,
            key=args.key,
            delay=args.delay,
            queue=args.queue,
        )
        (handle,) = await app.submit_many([spec])
        if args.json:
            _print_json({"id": handle.id, "created": handle.created})
        else:
            print(handle.id)
        if args.wait:
            result = await handle.result(timeout=args.wait)
            _print_json(result) if args.json else print(json.dumps(result))
        return 0
    finally:
        await app.aclose()


async def _with_store(
    args: argparse.Namespace, fn: Callable[[Store], Coroutine[Any, Any, int]]
) -> int:
    app = load_app(args.app) if getattr(args, "app", None) else None
    store = await _open(resolve_store_url(args, app))
    try:
        return await fn(store)
    finally:
        await store.close()


async def cmd_tasks_list(args: argparse.Namespace) -> int:
    async def run(store: Store) -> int:
        tasks = await store.list_tasks(state=args.state, queue=args.queue, limit=args.limit)
        if args.json:
            _print_json([_task_summary(t.to_json()) for t in tasks])
            return 0
        rows = [
            (t.id, t.type, t.queue, t.state, t.priority, t.attempts, t.fence, t.owner or "-")
            for t in tasks
        ]
        print(_table(rows, ["id", "type", "queue", "state", "prio", "attempts", "fence", "owner"]))
        return 0

    return await _with_store(args, run)


def _task_summary(d: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "id",
        "type",
        "queue",
        "state",
        "priority",
        "attempts",
        "max_attempts",
        "fence",
        "owner",
        "result",
        "error",
        "created_at",
        "updated_at",
    )
    return {k: d[k] for k in keep}


async def cmd_tasks_show(args: argparse.Namespace) -> int:
    async def run(store: Store) -> int:
        task = await store.get(args.id, history=True)
        data = task.to_json()
        if args.json:
            _print_json(data)
            return 0
        now = await store.now()
        for k in (
            "id",
            "type",
            "queue",
            "state",
            "priority",
            "attempts",
            "max_attempts",
            "fence",
            "owner",
            "key",
        ):
            print(f"{k:>13}: {data[k] if data[k] is not None else '-'}")
        print(f"{'created':>13}: {_age(now - task.created_at)} ago")
        if task.lease_deadline is not None:
            print(f"{'lease left':>13}: {_age(task.lease_deadline - now)}")
        print(f"{'args':>13}: {json.dumps(task.args)}  kwargs: {json.dumps(task.kwargs)}")
        for k in ("result", "error", "checkpoint"):
            if data[k] is not None:
                print(f"{k:>13}: {json.dumps(data[k])[:2000]}")
        if task.history:
            print("      history:")
            for e in task.history:
                who = f" by {e.expert}" if e.expert else ""
                more = f" ({e.detail})" if e.detail else ""
                print(
                    f"               {_age(now - e.at):>8} ago  {e.event:<10} fence {e.fence}{who}{more}"
                )
        return 0

    return await _with_store(args, run)


async def _manage(args: argparse.Namespace, action: str) -> int:
    """``tasks retry`` and ``tasks cancel``: one store call, the task's new state printed."""

    async def run(store: Store) -> int:
        task = await (store.retry if action == "retry" else store.cancel)(args.id)
        if args.json:
            _print_json(_task_summary(task.to_json()))
        else:
            print(f"{task.id} {task.state}")
        return 0

    return await _with_store(args, run)


async def cmd_tasks_retry(args: argparse.Namespace) -> int:
    return await _manage(args, "retry")


async def cmd_tasks_cancel(args: argparse.Namespace) -> int:
    return await _manage(args, "cancel")


async def cmd_status(args: argparse.Namespace) -> int:
    async def run(store: Store) -> int:
        stats = await store.stats()
        data = stats.to_json()
        if args.json:
            _print_json(data)
            return 0
        states = [str(s) for s in TaskState]
        rows = [[q, *(c.get(s, 0) for s in states)] for q, c in sorted(stats.counts.items())]
        print("queues")
        print(_table(rows, ["queue", *states]) if rows else "  (no tasks)")
        print()
        live = [e for e in stats.experts if e.alive]
        print(f"experts ({len(live)} live, {len(stats.experts) - len(live)} gone)")
        erows = []
        for e in stats.experts:
            m = e.metrics
            tier = e.info.tier
            if tier == "emergency":
                tier += " (on)" if m.get("active") else " (standby)"
            erows.append(
                (
                    e.info.id,
                    "live" if e.alive else "gone",
                    tier,
                    f"{e.load}/{e.info.capacity}",
                    _age(stats.now - e.heartbeat_at),
                    ",".join(sorted(e.info.capabilities.tags)) or "-",
                    e.tasks_done,
                    e.claims_won,
                    m.get("lost_races", e.claim_attempts - e.claims_won),
                    f"{e.claims_won / e.claim_attempts:.0%}" if e.claim_attempts else "-",
                    f"{float(m.get('window', 0)) * 1000:.0f}ms" if "window" in m else "-",
                )
            )
        if erows:
            print(
                _table(
                    erows,
                    [
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
                    ],
                )
            )
        comp = data["competition"]
        print()
        rate = comp["success_rate"]
        print(f"throughput (last minute): {data['throughput_per_s']:.1f} tasks/s")
        print(f"oldest pending: {_age(stats.oldest_pending_age)}")
        print(
            f"competition success rate: {'-' if rate is None else f'{rate:.1%}'} "
            f"({comp['claims_won']} won of {comp['claim_attempts']} attempts)"
        )
        return 0

    return await _with_store(args, run)


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


async def cmd_demo(args: argparse.Namespace) -> int:
    from contend.cli.demo import run_demo

    return await run_demo(args)


async def cmd_bench(args: argparse.Namespace) -> int:
    from contend.cli.bench import run_bench

    return await run_bench(args)


# -- parser --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="contend",
        description="Decentralized task scheduling by competition and claim.",
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("CONTEND_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    p.add_argument("--log-json", action="store_true", help="structured JSON log lines")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def store_opt(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--store", help="store URL (default: $CONTEND_STORE, then the app's)")

    e = sub.add_parser("expert", help="run an expert until SIGTERM")
    e.add_argument("app", help="MODULE:APP")
    store_opt(e)
    e.add_argument("--name", help="expert id (default host-pid); must not be live elsewhere")
    e.add_argument("--concurrency", "-c", type=_positive_int("--concurrency", 10_000), default=8)
    e.add_argument("--capability", action="append", metavar="TAG|NAME=AMOUNT")
    e.add_argument("--queue", "-q", action="append", metavar="QUEUE")
    e.add_argument(
        "--lease",
        type=_seconds("--lease", 0.5, 86_400),
        default=15.0,
        help="lease TTL in seconds (default 15)",
    )
    e.add_argument(
        "--grace",
        type=_seconds("--grace", 0, 86_400),
        default=30.0,
        help="seconds running tasks get to finish on SIGTERM (default 30)",
    )
    e.add_argument("--tier", choices=["general", "specialized", "emergency"], default="general")
    e.add_argument("--specialty", action="append", metavar="TASK_TYPE")
    e.add_argument(
        "--window",
        type=_seconds("--window", 0, 60),
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
        type=_int_in("--prefetch", 0, 10_000),
        default=0,
        help="claim this many tasks ahead, unstarted; idle experts may steal them (default 0)",
    )
    e.add_argument(
        "--steal-ratio",
        type=_seconds("--steal-ratio", 0.01, 1.0),
        default=1.0,
        help="steal unstarted tasks from experts at least this loaded (default 1.0: full)",
    )
    e.add_argument(
        "--no-steal", action="store_true", help="never take unstarted tasks from other experts"
    )
    e.add_argument(
        "--auction-window",
        type=_seconds("--auction-window", 0, 60),
        default=0.2,
        help="how long an auction for a heavy task takes bids (default 0.2 s)",
    )
    e.add_argument(
        "--zone-margin",
        type=_seconds("--zone-margin", 0, 60),
        default=0.0,
        help="extra race delay for tasks that prefer tags (a zone) this expert lacks",
    )
    e.set_defaults(func=cmd_expert)

    s = sub.add_parser("submit", help="submit a task; prints its id")
    s.add_argument("app", help="MODULE:APP")
    s.add_argument("task", help="task type name")
    store_opt(s)
    s.add_argument("--args", type=_json_arg("--args", list), default=[])
    s.add_argument("--kwargs", type=_json_arg("--kwargs", dict), default={})
    s.add_argument("--priority", type=_int_in("--priority", -1_000_000, 1_000_000), default=None)
    s.add_argument("--key", help="idempotency key: a second submit returns the first task")
    s.add_argument("--delay", type=_seconds("--delay", 0, 366 * 86400), default=0.0)
    s.add_argument("--queue")
    s.add_argument(
        "--batch", metavar="FILE.jsonl", help="submit one task per JSON line ('-' = stdin)"
    )
    s.add_argument(
        "--wait",
        type=_seconds("--wait", 0.001, 86_400),
        metavar="SECONDS",
        help="wait for the result and print it",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_submit)

    t = sub.add_parser("tasks", help="list, show, retry or cancel tasks")
    tsub = t.add_subparsers(dest="tasks_command", required=True, metavar="ACTION")
    tl = tsub.add_parser("list", help="list tasks")
    tl.add_argument("--state", choices=[str(s) for s in TaskState])
    tl.add_argument("--queue")
    tl.add_argument("--limit", type=_positive_int("--limit", 1_000_000), default=100)
    tl.set_defaults(func=cmd_tasks_list)
    ts = tsub.add_parser("show", help="one task, with its history of claims")
    ts.add_argument("id")
    ts.set_defaults(func=cmd_tasks_show)
    tr = tsub.add_parser("retry", help="send a failed, dead or cancelled task back to pending")
    tr.add_argument("id")
    tr.set_defaults(func=cmd_tasks_retry)
    tc = tsub.add_parser("cancel", help="cancel a pending or running task")
    tc.add_argument("id")
    tc.set_defaults(func=cmd_tasks_cancel)
    for sp in (tl, ts, tr, tc):
        store_opt(sp)
        sp.add_argument("--app", help="MODULE:APP whose store to use")
        sp.add_argument("--json", action="store_true")

    st = sub.add_parser("status", help="queue depths, experts, throughput, competition")
    store_opt(st)
    st.add_argument("--app", help="MODULE:APP whose store to use")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    mg = sub.add_parser("migrate", help="create or upgrade the store's schema (PostgreSQL)")
    store_opt(mg)
    mg.add_argument("--app", help="MODULE:APP whose store to use")
    mg.set_defaults(func=cmd_migrate)

    d = sub.add_parser("demo", help="a live demo: experts, a workload, a crash, a report")
    d.add_argument("--store", help="store URL (default: a new SQLite file in a temp dir)")
    d.add_argument("--tasks", type=_positive_int("--tasks", 1_000_000), default=3000)
    d.add_argument("--experts", type=_int_in("--experts", 2, 32), default=4)
    d.add_argument("--no-kill", action="store_true", help="do not kill an expert")
    d.add_argument(
        "--window",
        type=_seconds("--window", 0, 60),
        default=0.02,
        help="the experts' base race window (0 turns competition off, for comparison)",
    )
    d.add_argument("--json", action="store_true", help="print the closing report as JSON")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser(
        "bench", help="measure throughput, latency and memory; write docs/benchmarks.md"
    )
    b.add_argument("--store", help="store URL (default: SQLite files in a temp dir)")
    b.add_argument("--tasks", type=_positive_int("--tasks", 10_000_000), default=20_000)
    b.add_argument("--out", default="docs/benchmarks.md")
    b.add_argument("--quick", action="store_true", help="a small run, for a smoke test")
    b.add_argument(
        "--processes",
        type=_int_list("--processes"),
        default=[1, 2],
        help="expert process counts to drain with, e.g. 1,2,4 (default 1,2)",
    )
    b.add_argument(
        "--concurrency",
        type=_positive_int("--concurrency", 10_000),
        default=32,
        help="each bench expert's concurrency (default 32)",
    )
    b.set_defaults(func=cmd_bench)
    return p


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": round(record.created, 3),
                "level": record.levelname,
                "logger": record.name,
                "pid": record.process,
                "msg": record.getMessage(),
            }
        )


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


def _fail(message: str, code: int) -> NoReturn:
    print(f"contend: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_json)
    started = time.monotonic()
    try:
        code = asyncio.run(args.func(args))
    except KeyboardInterrupt:
        return 130
    except (ConfigError, TaskError, SchemaError) as exc:
        _fail(str(exc), 2)
    except ContendError as exc:
        _fail(str(exc), 1)
    log.debug("%s took %.3fs", args.command, time.monotonic() - started)
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
