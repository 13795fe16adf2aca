"""``contend submit``: one task from the options, or one per line of a JSON-lines batch."""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from contend.cli.common import (
    Subcommands,
    UsageError,
    add_store_option,
    int_in,
    json_arg,
    load_app,
    print_json,
    queue_arg,
    resolve_store_url,
    seconds,
    text_arg,
)
from contend.cli.task_ids import check_prefix, is_prefix, resolve_id
from contend.domain.payload import parse_json
from contend.domain.task import IfFailed, Task, TaskSpec, TaskState
from contend.errors import ContendError, TaskError, TaskFailed, shown
from contend.runtime.app import After, App, TaskHandle

BATCH_FIELDS = {
    "args",
    "kwargs",
    "priority",
    "key",
    "delay",
    "queue",
    "requirements",
    "timeout",
    "depends_on",
}
CHUNK = 1000  # tasks per submit_many call of a batch


def add_parser(sub: Subcommands) -> None:
    s = sub.add_parser("submit", help="submit a task; prints its id")
    s.add_argument("app", help="MODULE:APP")
    s.add_argument("task", help="task type name")
    add_store_option(s)
    s.add_argument(
        "--args", type=json_arg("--args", list), help="a JSON array, or @FILE holding one"
    )
    s.add_argument(
        "--kwargs", type=json_arg("--kwargs", dict), help="a JSON object, or @FILE holding one"
    )
    s.add_argument("--priority", type=int_in("--priority", -1_000_000, 1_000_000), default=None)
    s.add_argument("--key", help="idempotency key: a second submit returns the first task")
    s.add_argument("--delay", type=seconds("--delay", 0, 366 * 86400))
    s.add_argument("--queue", type=queue_arg())
    s.add_argument(
        "--requirements",
        type=json_arg("--requirements", (list, dict)),
        metavar="JSON",
        help='what an expert must have: tags ["gpu"] or {"tags": [...], "resources": '
        '{"mem_gb": 16}} (default: the task type\'s)',
    )
    s.add_argument(
        "--timeout",
        type=seconds("--timeout", 0.001, 366 * 86400),
        metavar="SECONDS",
        help="how long one attempt may run (default: the task type's)",
    )
    s.add_argument(
        "--depends-on",
        action="append",
        type=text_arg("--depends-on"),
        metavar="ID[:IF_FAILED]",
        dest="depends_on",
        help="a task that must end first (its id, or a unique prefix of it); repeat for more. "
        "If it does not succeed, this task dies (ID or ID:fail), is cancelled (ID:cancel) or "
        "runs anyway (ID:run)",
    )
    s.add_argument(
        "--batch",
        metavar="FILE.jsonl",
        help="submit one task per JSON line ('-' = stdin); run it again after an interruption "
        "and the lines already stored are not submitted twice",
    )
    s.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show how far a --batch has got, on stderr (default: when stderr is a terminal)",
    )
    s.add_argument(
        "--wait",
        type=seconds("--wait", 0.001, 86_400),
        metavar="SECONDS",
        help="wait for the result and print it",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_submit)


@dataclass(frozen=True)
class BatchLine:
    number: int  # 1-based, as an editor counts lines
    fields: dict[str, Any]


def _read_bytes(path: str) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read batch file {shown(path)}: {exc.strerror}") from exc


def _parse_line(where: str, raw: bytes) -> dict[str, Any] | None:
    """One line's fields, None for a blank line; a TaskError that starts with *where*."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(
            f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02X} at byte {exc.start + 1} "
            "of the line); save the file as UTF-8"
        ) from None
    if not line.strip():
        return None
    try:
        item = parse_json(line, "the line")
    except TaskError as exc:
        raise TaskError(f"{where}: {exc}") from None
    if not isinstance(item, dict):
        raise TaskError(f"{where}: each line must be a JSON object")
    unknown = set(item) - BATCH_FIELDS
    if unknown:
        raise TaskError(f"{where}: unknown field(s) {shown(sorted(unknown))}")
    return item


def read_batch(path: str) -> tuple[list[BatchLine], bytes]:
    """The JSON objects of a batch file, one a line (blank lines are skipped), and the file's
    bytes. A line that is not UTF-8, not JSON or not an object refuses the file, named."""
    data = _read_bytes(path)
    lines = []
    for n, raw in enumerate(data.splitlines(), 1):
        if n == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]  # as some editors on Windows write UTF-8
        item = _parse_line(f"{path}:{n}", raw)
        if item is not None:
            lines.append(BatchLine(n, item))
    return lines, data


def batch_digest(task: str, data: bytes) -> str:
    """What names one batch: its task type and the file's bytes."""
    return hashlib.sha256(task.encode() + b"\0" + data).hexdigest()[:32]


def batch_key(digest: str, line: int) -> str:
    """The idempotency key of a batch line that gives none: the same task type, file content
    and line make the same key, so running a batch again adds only the lines not yet stored."""
    return f"batch:{digest}:{line}"


# The single-task options a batch takes from each line instead (their defaults are None).
SINGLE_OPTIONS = (
    "args",
    "kwargs",
    "priority",
    "key",
    "delay",
    "queue",
    "requirements",
    "timeout",
    "depends_on",
    "wait",
)


async def _submit_batch(app: App, args: argparse.Namespace) -> int:
    given = [f"--{name}" for name in SINGLE_OPTIONS if getattr(args, name) is not None]
    if given:
        raise UsageError(
            f"{', '.join(given)} cannot be combined with --batch: each line of the file "
            "gives its task's fields"
        )
    lines, data = read_batch(args.batch)
    digest = batch_digest(args.task, data)
    specs = []
    for line in lines:
        item = line.fields
        key = item.get("key")
        try:
            specs.append(
                app.build_spec(
                    args.task,
                    item.get("args", []),
                    item.get("kwargs"),
                    priority=item.get("priority"),
                    key=batch_key(digest, line.number) if key is None else key,
                    delay=item.get("delay", 0.0),
                    queue=item.get("queue"),
                    requirements=item.get("requirements"),
                    timeout=item.get("timeout"),
                    depends_on=_edges(item.get("depends_on", [])),
                )
            )
        except TaskError as exc:
            raise TaskError(f"{args.batch}:{line.number}: {exc}") from exc
    handles = []
    progress = Progress(len(specs), args.progress)
    for start in range(0, len(specs), CHUNK):  # each chunk all or none; a rerun completes
        handles += await app.submit_many(specs[start : start + CHUNK])
        progress.show(len(handles))
    progress.done()
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


def _edges(value: Any) -> list[str | After]:
    """A batch line's ``depends_on``: a list of task ids, or of ``{"id": ID, "if_failed":
    "fail" | "cancel" | "run"}`` objects."""
    if not isinstance(value, list):
        raise TaskError(f"depends_on must be a list of task ids, got {shown(value)}")
    out: list[str | After] = []
    for v in value:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict) and isinstance(v.get("id"), str) and set(v) <= {"id", "if_failed"}:
            out.append(After(v["id"], v.get("if_failed", "fail")))
        else:
            raise TaskError(
                "each of depends_on must be a task id or "
                f'{{"id": ID, "if_failed": "fail" | "cancel" | "run"}}, got {shown(v)}'
            )
    return out


def edge_arg(value: str) -> str | After:
    """``--depends-on ID[:IF_FAILED]``: a dependency, with its choice when it ends in one."""
    head, sep, tail = value.rpartition(":")
    if sep and head and tail in IF_FAILED:
        return After(head, tail)
    return value


IF_FAILED = tuple(str(c) for c in IfFailed)


class Progress:
    """How far a batch has got, on stderr: one line rewritten on a terminal, else a line per
    chunk (only when asked with ``--progress``)."""

    def __init__(self, total: int, wanted: bool | None) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.on = (self.tty if wanted is None else wanted) and total > 0
        self.started = time.monotonic()

    def show(self, done: int) -> None:
        if not self.on:
            return
        rate = done / max(1e-9, time.monotonic() - self.started)
        line = (
            f"submitting: {done:,}/{self.total:,} task(s) ({done / self.total:.0%}, {rate:,.0f}/s)"
        )
        if self.tty:
            print(f"\r{line}", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.on and self.tty:
            print(file=sys.stderr)


class WaitTimedOut(ContendError):
    """``submit --wait``: the task did not end in time."""


async def _served(app: App, queue: str) -> bool:
    """Whether a live expert claims from *queue*."""
    experts = await (await app.store()).list_experts()
    return any(e.alive and queue in e.info.queues for e in experts)


def _nobody(args: argparse.Namespace, queue: str) -> str:
    return (
        f"no live expert serves queue {queue!r}: start one with "
        f"`contend expert {args.app} --store ...`"
    )


async def _wait(app: App, args: argparse.Namespace, handle: TaskHandle, queue: str) -> Task:
    """Wait for the task to end: the Task, or WaitTimedOut saying why it may not have."""
    if not await _served(app, queue):
        print(f"contend: warning: {_nobody(args, queue)}; waiting {args.wait:g}s", file=sys.stderr)
    try:
        await handle.result(timeout=args.wait)
    except TimeoutError:
        task = await handle.get()
        why = "" if await _served(app, queue) else f"; {_nobody(args, queue)}"
        if args.json:
            print_json(_document(handle, task))
        raise WaitTimedOut(
            f"task {handle.id} did not finish within {args.wait:g}s (it is {task.state}){why}"
        ) from None
    except TaskFailed:
        pass  # said below, with the document
    return await handle.get()


def _document(handle: TaskHandle, task: Task) -> dict[str, Any]:
    return {
        "id": handle.id,
        "created": handle.created,
        "state": str(task.state),
        "result": task.result,
        "error": task.error,
    }


def _spec(app: App, args: argparse.Namespace, edges: list[str | After]) -> TaskSpec:
    return app.build_spec(
        args.task,
        args.args or [],
        args.kwargs,
        priority=args.priority,
        key=args.key,
        delay=args.delay or 0.0,
        queue=args.queue,
        requirements=args.requirements,
        timeout=args.timeout,
        depends_on=edges,
    )


def _edge_id(edge: str | After) -> str:
    if not isinstance(edge, After):
        return edge
    return edge.task if isinstance(edge.task, str) else edge.task.id


async def _resolved(app: App, edges: list[str | After]) -> list[str | After]:
    """*edges* with each id prefix (``--depends-on 01a231d2``) replaced by the id it names."""
    store = await app.store()
    out: list[str | After] = []
    for edge in edges:
        if isinstance(edge, After):
            out.append(After(await resolve_id(store, _edge_id(edge)), edge.if_failed))
        else:
            out.append(await resolve_id(store, edge))
    return out


async def _submit_one(app: App, args: argparse.Namespace) -> int:
    edges = [edge_arg(d) for d in args.depends_on or ()]
    for edge in edges:
        check_prefix(_edge_id(edge))
    spec = _spec(app, args, edges)  # every check but the dependencies' before the store opens
    if any(is_prefix(_edge_id(e)) for e in edges):
        spec = _spec(app, args, await _resolved(app, edges))
    (handle,) = await app.submit_many([spec])
    if not args.wait:
        if args.json:
            print_json({"id": handle.id, "created": handle.created})
        else:
            print(handle.id)
        return 0
    if not args.json:
        print(handle.id)
    task = await _wait(app, args, handle, spec.queue)
    if args.json:
        print_json(_document(handle, task))  # one document: the id and how it ended
    elif task.state == TaskState.SUCCEEDED:
        print(json.dumps(task.result))
    if task.state != TaskState.SUCCEEDED:
        raise TaskFailed(handle.id, task.state, task.error)
    return 0


async def cmd_submit(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    app.with_store(resolve_store_url(args, app))
    try:
        return await (_submit_batch if args.batch else _submit_one)(app, args)
    finally:
        await app.aclose()
