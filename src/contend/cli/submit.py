"""``contend submit``: one task from the options, or one per line of a JSON-lines batch."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from contend.cli.common import (
    Subcommands,
    UsageError,
    add_store_option,
    int_in,
    json_arg,
    load_app,
    print_json,
    resolve_store_url,
    seconds,
)
from contend.errors import TaskError
from contend.runtime.app import App

BATCH_FIELDS = {"args", "kwargs", "priority", "key", "delay", "queue", "requirements"}
CHUNK = 1000  # tasks per submit_many call of a batch


def add_parser(sub: Subcommands) -> None:
    s = sub.add_parser("submit", help="submit a task; prints its id")
    s.add_argument("app", help="MODULE:APP")
    s.add_argument("task", help="task type name")
    add_store_option(s)
    s.add_argument("--args", type=json_arg("--args", list), default=[])
    s.add_argument("--kwargs", type=json_arg("--kwargs", dict), default={})
    s.add_argument("--priority", type=int_in("--priority", -1_000_000, 1_000_000), default=None)
    s.add_argument("--key", help="idempotency key: a second submit returns the first task")
    s.add_argument("--delay", type=seconds("--delay", 0, 366 * 86400), default=0.0)
    s.add_argument("--queue")
    s.add_argument(
        "--batch", metavar="FILE.jsonl", help="submit one task per JSON line ('-' = stdin)"
    )
    s.add_argument(
        "--wait",
        type=seconds("--wait", 0.001, 86_400),
        metavar="SECONDS",
        help="wait for the result and print it",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_submit)


def read_batch(path: str) -> list[dict[str, Any]]:
    """The JSON objects of a batch file, one a line; blank lines are skipped."""
    items = []
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
            unknown = set(item) - BATCH_FIELDS
            if unknown:
                raise TaskError(f"{path}:{n}: unknown field(s) {sorted(unknown)}")
            items.append(item)
    return items


async def _submit_batch(app: App, args: argparse.Namespace) -> int:
    specs = []
    for n, item in enumerate(read_batch(args.batch), 1):
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
    for start in range(0, len(specs), CHUNK):
        handles += await app.submit_many(specs[start : start + CHUNK])
    if args.json:
        print_json([{"id": h.id, "created": h.created} for h in handles])
    else:
        for h in handles:
            print(h.id)
        print(
            f"submitted {sum(h.created for h in handles)} task(s), "
            f"{sum(not h.created for h in handles)} already present",
            file=sys.stderr,
        )
    return 0


async def _submit_one(app: App, args: argparse.Namespace) -> int:
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
        print_json({"id": handle.id, "created": handle.created})
    else:
        print(handle.id)
    if args.wait:
        result = await handle.result(timeout=args.wait)
        print_json(result) if args.json else print(json.dumps(result))
    return 0


async def cmd_submit(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    app.with_store(resolve_store_url(args, app))
    try:
        return await (_submit_batch if args.batch else _submit_one)(app, args)
    finally:
        await app.aclose()
