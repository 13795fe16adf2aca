"""``contend tasks list|show|retry|cancel``: look at tasks and manage one by id (or by a unique
prefix of its id: ``task_ids``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from contend.cli.common import (
    Subcommands,
    add_read_options,
    age,
    positive_int,
    print_json,
    queue_arg,
    table,
    text_arg,
    with_store,
)
from contend.cli.task_ids import resolve_id
from contend.domain.ids import ID_LENGTH, MIN_PREFIX
from contend.domain.task import Task, TaskState
from contend.errors import TaskNotFound
from contend.store.diagnosis import diagnose
from contend.store.port import Store

#: The most dependants ``tasks show`` lists (a fan-out of thousands would bury the rest).
CHILDREN_SHOWN = 100

# The fields of a task in ``list --json`` and in the answer of ``retry``/``cancel --json``.
SUMMARY_FIELDS = (
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
# The fields ``show`` prints first, one a line.
SHOW_FIELDS = (
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
)


ID_HELP = f"a task id, or a unique prefix of at least {MIN_PREFIX} of its characters"


def add_parser(sub: Subcommands) -> None:
    t = sub.add_parser("tasks", help="list, show, retry or cancel tasks")
    tsub = t.add_subparsers(dest="tasks_command", required=True, metavar="ACTION")
    tl = tsub.add_parser("list", help="list tasks")
    tl.add_argument("--state", choices=[str(s) for s in TaskState])
    tl.add_argument("--queue", type=queue_arg())
    tl.add_argument("--type", type=text_arg("--type"), help="only tasks of this task type")
    tl.add_argument(
        "--newest", action="store_true", help="the newest tasks first (default: the oldest)"
    )
    tl.add_argument("--limit", type=positive_int("--limit", 1_000_000), default=100)
    tl.set_defaults(func=cmd_tasks_list)
    ts = tsub.add_parser("show", help="one task, with its history of claims")
    ts.add_argument("id", type=text_arg("ID"), help=ID_HELP)
    ts.set_defaults(func=cmd_tasks_show)
    tr = tsub.add_parser("retry", help="send a failed, dead or cancelled task back to pending")
    tr.add_argument("id", type=text_arg("ID"), help=ID_HELP)
    tr.set_defaults(func=cmd_tasks_retry)
    tc = tsub.add_parser("cancel", help="cancel a pending or running task")
    tc.add_argument("id", type=text_arg("ID"), help=ID_HELP)
    tc.set_defaults(func=cmd_tasks_cancel)
    for sp in (tl, ts, tr, tc):
        add_read_options(sp)


def progress_text(p: Any) -> str:
    """``3/10 (30%) resizing`` from a task's progress."""
    if not isinstance(p, dict):
        return json.dumps(p)
    done, total, note = p.get("done"), p.get("total"), p.get("note")
    text = f"{done:g}" if isinstance(done, int | float) else str(done)
    if isinstance(total, int | float) and isinstance(done, int | float):
        text += f"/{total:g}" + (f" ({done / total:.0%})" if total else "")
    return f"{text} {note}" if note else text


def task_summary(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in SUMMARY_FIELDS}


LIST_COLUMNS = ["id", "type", "queue", "state", "prio", "attempts", "fence", "owner"]


def _due(t: Task, now: float) -> str:
    """When a pending or waiting task is due: ``in 5.0s``, or how long it has waited."""
    if t.state not in (TaskState.PENDING, TaskState.WAITING):
        return "-"
    if t.run_at > now:
        return f"in {age(t.run_at - now)}"
    return f"{age(now - t.run_at)} ago"


async def cmd_tasks_list(args: argparse.Namespace) -> int:
    async def run(store: Store) -> int:
        got = await store.list_tasks(
            state=args.state,
            queue=args.queue,
            type=args.type,
            newest=args.newest,
            limit=args.limit + 1,
        )
        tasks, more = got[: args.limit], len(got) > args.limit
        if args.json:
            print_json([task_summary(t.to_json()) for t in tasks])
        else:
            now = await store.now()
            rows = [
                (
                    t.id,
                    t.type,
                    t.queue,
                    t.state,
                    t.priority,
                    t.attempts,
                    t.fence,
                    t.owner or "-",
                    f"{age(now - t.created_at)} ago",
                    _due(t, now),
                )
                for t in tasks
            ]
            print(table(rows, [*LIST_COLUMNS, "created", "due"]))
        if more:
            print(
                f"contend: the first {len(tasks):,} task(s) by id "
                f"({'newest' if args.newest else 'oldest'} first); more exist: raise --limit "
                "or narrow with --state, --queue or --type"
                + ("" if args.newest else " (--newest lists the newest first)"),
                file=sys.stderr,
            )
        return 0

    return await with_store(args, run)


async def _get(store: Store, task_id: str, *, history: bool = False) -> Task:
    """The task, or a TaskNotFound that says what an id is when the one given is shorter."""
    try:
        return await store.get(task_id, history=history)
    except TaskNotFound:
        if len(task_id) < ID_LENGTH:
            raise TaskNotFound(
                task_id,
                f"task ids are {ID_LENGTH} hex digits: give one whole, or at least {MIN_PREFIX} "
                "of its first (`contend tasks list` prints them)",
            ) from None
        raise


def limit_text(task: Task) -> str:
    """``tenant:a (at most 3 at once, fair share)``: a task's limit key and its limits."""
    notes = [f"at most {task.concurrency_limit} at once"] if task.concurrency_limit else []
    if task.fair:
        notes.append("fair share")
    return f"{task.limit_key}" + (f" ({', '.join(notes)})" if notes else "")


async def cmd_tasks_show(args: argparse.Namespace) -> int:
    async def run(store: Store) -> int:
        task = await _get(store, await resolve_id(store, args.id), history=True)
        data = task.to_json()
        why = await diagnose(store, task)
        parents = [await _parent(store, task, pid) for pid in task.depends_on]
        found = await store.dependants(task.id, limit=CHILDREN_SHOWN + 1)
        children = [_child(t, task.id) for t in found[:CHILDREN_SHOWN]]
        if args.json:
            data["why_not_running"] = None if why is None else why.to_json()
            data["parents"] = parents
            data["children"] = children
            data["more_children"] = len(found) > CHILDREN_SHOWN
            print_json(data)
            return 0
        now = await store.now()
        for k in SHOW_FIELDS:
            print(f"{k:>13}: {data[k] if data[k] is not None else '-'}")
        if task.limit_key is not None:
            print(f"{'limit key':>13}: {limit_text(task)}")
        if why is not None:
            print(f"{'not running':>13}: {why.blocker}: {why.message}")
        print(f"{'created':>13}: {age(now - task.created_at)} ago")
        if task.lease_deadline is not None:
            print(f"{'lease left':>13}: {age(task.lease_deadline - now)}")
        print(f"{'args':>13}: {json.dumps(task.args)}  kwargs: {json.dumps(task.kwargs)}")
        if parents:
            print(f"{'depends on':>13}:")
            for p in parents:
                print(
                    f"               {p['id']}  {p['type'] or '?':<16} {p['state']:<10}"
                    f" if failed: {p['if_failed']}"
                )
        _print_children(children, more=len(found) > CHILDREN_SHOWN)
        if task.progress is not None:
            print(f"{'progress':>13}: {progress_text(task.progress)}")
        for k in ("result", "error", "checkpoint"):
            if data[k] is not None:
                print(f"{k:>13}: {json.dumps(data[k])[:2000]}")
        if task.history:
            print("      history:")
            for e in task.history:
                who = f" by {e.expert}" if e.expert else ""
                more = f" ({e.detail})" if e.detail else ""
                print(
                    f"               {age(now - e.at):>8} ago  {e.event:<10} fence {e.fence}{who}{more}"
                )
        return 0

    return await with_store(args, run)


async def _parent(store: Store, task: Task, task_id: str) -> dict[str, str | None]:
    """One dependency of *task* as ``tasks show`` prints it (a pruned one is 'gone'), with
    what it does to the task if it does not succeed."""
    choice = task.if_failed_of(task_id)
    try:
        parent = await store.get(task_id)
    except TaskNotFound:
        return {"id": task_id, "type": None, "state": "gone", "if_failed": choice}
    return {"id": task_id, "type": parent.type, "state": str(parent.state), "if_failed": choice}


def _child(child: Task, task_id: str) -> dict[str, str | None]:
    """A task that depends on *task_id*, and what its edge does if *task_id* does not succeed."""
    return {
        "id": child.id,
        "type": child.type,
        "state": str(child.state),
        "if_failed": child.if_failed_of(task_id),
    }


def _print_children(children: list[dict[str, str | None]], *, more: bool) -> None:
    if not children:
        return
    print(f"{'needed by':>13}:")
    for c in children:
        print(
            f"               {c['id']}  {c['type']:<16} {c['state']:<10}"
            f" if this fails: {c['if_failed']}"
        )
    if more:
        print(f"               (the first {CHILDREN_SHOWN} by id; more depend on it)")


async def _manage(args: argparse.Namespace, action: str) -> int:
    """``tasks retry`` and ``tasks cancel``: one store call, the task's new state printed."""

    async def run(store: Store) -> int:
        task_id = await resolve_id(store, args.id)
        try:
            task = await (store.retry if action == "retry" else store.cancel)(task_id)
        except TaskNotFound:
            await _get(store, task_id)  # raises, saying when the id is too short
            raise
        if args.json:
            print_json(task_summary(task.to_json()))
        else:
            print(f"{task.id} {task.state}")
        return 0

    return await with_store(args, run)


async def cmd_tasks_retry(args: argparse.Namespace) -> int:
    return await _manage(args, "retry")


async def cmd_tasks_cancel(args: argparse.Namespace) -> int:
    return await _manage(args, "cancel")
