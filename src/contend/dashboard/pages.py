"""The dashboard's pages, rendered from values the routes read through the Store port."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from contend.dashboard.html import (
    Safe,
    age,
    esc,
    join,
    live,
    page,
    percent,
    pretty_json,
    table,
    tag,
)
from contend.domain.blocking import Blocker, Diagnosis
from contend.domain.task import IfFailed, Task, TaskState
from contend.store.port import ExpertRecord, StoreStats

STATES = [str(s) for s in TaskState]
RETRYABLE = {TaskState.FAILED, TaskState.DEAD, TaskState.CANCELLED}
CANCELLABLE = {TaskState.PENDING, TaskState.WAITING, TaskState.CLAIMED, TaskState.RUNNING}


def chart(series: str, label: str) -> Safe:
    """A live line chart the script draws from ``/api/live`` (``points[*][series]``)."""
    return tag(
        "figure",
        join(
            [
                tag("figcaption", label),
                tag("svg", "", class_="chart", data_series=series, viewBox="0 0 600 160"),
            ]
        ),
    )


def _state_class(state: str) -> str:
    return f"state state-{state}"


def state_badge(state: str) -> Safe:
    return tag("span", state, class_=_state_class(state))


def overview(stats: StoreStats, blocked: Mapping[str, int], *, root: str) -> str:
    totals = {s: sum(c.get(s, 0) for c in stats.counts.values()) for s in STATES}
    cards = join(
        tag(
            "div",
            join([tag("div", live(f"total:{s}", totals[s]), class_="n"), state_badge(s)]),
            class_="card",
        )
        for s in STATES
    )
    live_experts = sum(1 for e in stats.experts if e.alive)
    summary = table(
        ["", ""],
        [
            (
                "throughput (last minute)",
                live("throughput", f"{stats.done_last_minute / 60:.1f}/s"),
            ),
            ("oldest pending", live("oldest_pending", age(stats.oldest_pending_age))),
            ("live experts", live("live_experts", live_experts)),
            ("competition success rate", live("success_rate", percent(_rate(stats.experts)))),
        ],
        class_="facts",
    )
    reasons = table(
        ["why pending tasks are not running", "tasks"],
        [(tag("code", r), live(f"blocked:{r}", n)) for r, n in sorted(blocked.items())],
    )
    body = join(
        [
            tag("section", cards, class_="cards"),
            chart("throughput", "tasks finished per second (live)"),
            tag("div", join([summary, reasons]), class_="two"),
        ]
    )
    return page("Overview", body, root=root, active="overview")


def _rate(experts: Sequence[ExpertRecord]) -> float | None:
    attempts = sum(e.claim_attempts for e in experts if e.alive)
    return sum(e.claims_won for e in experts if e.alive) / attempts if attempts else None


def _task_success(e: ExpertRecord) -> float | None:
    """Runs that succeeded over all runs, from the heartbeat's per type record
    (``types: {type: [done, failed, mean seconds]}``)."""
    types = e.metrics.get("types")
    if not isinstance(types, dict):
        return None
    done = failed = 0
    for rec in types.values():
        if isinstance(rec, list) and len(rec) >= 2:
            done += int(rec[0] or 0)
            failed += int(rec[1] or 0)
    return done / (done + failed) if done + failed else None


def experts(stats: StoreStats, *, root: str) -> str:
    rows = []
    for e in sorted(stats.experts, key=lambda e: (not e.alive, e.info.id)):
        info, key = e.info, f"expert:{e.info.id}"
        lost = e.metrics.get("lost_races", e.claim_attempts - e.claims_won)
        caps = info.capabilities
        tags_ = sorted(caps.tags) + [f"{k}={v:g}" for k, v in sorted(caps.resources.items())]
        tier = info.tier
        if tier == "emergency":
            tier += " (on)" if e.metrics.get("active") else " (standby)"
        rows.append(
            (
                tag("strong", info.id),
                "live" if e.alive else "gone",
                ", ".join(tags_) or "-",
                tier,
                ", ".join(info.queues),
                live(f"{key}:load", f"{e.load}/{info.capacity}"),
                live(f"{key}:heartbeat", age(stats.now - e.heartbeat_at)),
                live(f"{key}:won", e.claims_won),
                live(f"{key}:lost", lost),
                live(f"{key}:done", e.tasks_done),
                percent(e.claims_won / e.claim_attempts if e.claim_attempts else None),
                percent(_task_success(e)),
            )
        )
    headers = [
        "expert", "state", "capabilities", "tier", "queues", "load", "heartbeat",
        "won", "lost", "done", "claim success", "task success",
    ]  # fmt: skip
    return page("Experts", table(headers, rows, id="experts"), root=root, active="experts")


def queues(
    stats: StoreStats,
    throughput: Mapping[str, float],
    oldest: Mapping[str, float | None],
    *,
    root: str,
) -> str:
    rows = []
    for q, counts in sorted(stats.counts.items()):
        rows.append(
            (
                tag("a", q, href=f"{root}/tasks?{urlencode({'queue': q})}"),
                *(live(f"queue:{q}:{s}", counts.get(s, 0)) for s in STATES),
                live(f"queue:{q}:throughput", f"{throughput.get(q, 0.0):.1f}/s"),
                live(f"queue:{q}:oldest", age(oldest.get(q))),
            )
        )
    body = table(["queue", *STATES, "throughput", "oldest pending"], rows, id="queues")
    return page("Queues", body, root=root, active="queues")


@dataclass(frozen=True)
class TaskFilter:
    state: str | None = None
    queue: str | None = None
    type: str | None = None
    text: str | None = None


def _select(name: str, options: Sequence[str], chosen: str | None) -> Safe:
    opts = [tag("option", "any", value="")]
    opts += [tag("option", o, value=o, selected=o == chosen) for o in options]
    return tag("select", join(opts), name=name, id=f"filter-{name}")


def _task_filter_form(f: TaskFilter, queue_names: Sequence[str], root: str) -> Safe:
    text = f'<input name="q" value="{esc(f.text or "")}" placeholder="id, args, error…">'
    fields = [
        tag("label", join(["state ", _select("state", STATES, f.state)])),
        tag("label", join(["queue ", _select("queue", queue_names, f.queue)])),
        tag("label", join(["type ", Safe(f'<input name="type" value="{esc(f.type or "")}">')])),
        tag("label", join(["text ", Safe(text)])),
        tag("button", "filter", type="submit"),
    ]
    return tag("form", join(fields), method="get", action=f"{root}/tasks", class_="filters")


def tasks(
    found: Sequence[tuple[Task, Diagnosis | None]],
    f: TaskFilter,
    queue_names: Sequence[str],
    now: float,
    scanned: int,
    more: bool,
    *,
    root: str,
) -> str:
    form = _task_filter_form(f, queue_names, root)
    rows = [
        (
            tag("a", t.id, href=f"{root}/tasks/{t.id}", class_="mono"),
            t.type,
            t.queue,
            state_badge(str(t.state)),
            f"{t.attempts}/{t.max_attempts}",
            t.fence,
            t.owner or "-",
            age(now - t.created_at),
            tag("span", why.message, title=str(why.blocker), class_=f"why why-{why.blocker}")
            if why is not None
            else "",
        )
        for t, why in found
    ]
    note = (
        f"{len(found)} shown, newest first, of the {scanned} newest tasks that match state, "
        "queue and type"
    )
    if more:
        note += " (more exist: narrow the filter)"
    body = join(
        [
            form,
            tag("p", note, class_="muted"),
            table(
                [
                    "id",
                    "type",
                    "queue",
                    "state",
                    "attempts",
                    "fence",
                    "owner",
                    "age",
                    "why not running",
                ],
                rows,
                id="tasks",
            ),
        ]
    )
    return page("Tasks", body, root=root, active="tasks")


def _button(task_id: str, action: str, csrf: str, root: str) -> Safe:
    return tag(
        "form",
        join(
            [
                Safe(f'<input type="hidden" name="csrf" value="{esc(csrf)}">'),
                tag("button", action, type="submit", id=f"{action}-button", class_=action),
            ]
        ),
        method="post",
        action=f"{root}/tasks/{task_id}/{action}",
        class_="inline",
    )


def _edge(task: Task, dependency: str, root: str) -> Safe:
    """A link to one dependency of *task*, with its edge's choice when it is not ``fail``."""
    link = tag("a", dependency, href=f"{root}/tasks/{dependency}", class_="mono")
    choice = task.if_failed_of(dependency)
    if choice == IfFailed.FAIL:
        return link
    return join([link, " ", tag("small", f"(if failed: {choice})")])


def _progress(p: Mapping[str, Any]) -> Safe:
    done, total, note = p.get("done"), p.get("total"), p.get("note")
    parts: list[Any] = []
    if isinstance(done, int | float) and isinstance(total, int | float) and total > 0:
        share = max(0.0, min(1.0, done / total))
        parts.append(tag("progress", f"{share:.0%}", value=f"{share:.3f}", max="1"))
        parts.append(f" {done:g} of {total:g} ({share:.0%})")
    else:
        parts.append(f"{done}")
    if note:
        parts.append(f" — {note}")
    return tag("span", join(parts), id="progress")


def task_detail(
    task: Task, why: Diagnosis | None, now: float, csrf: str, note: str = "", *, root: str
) -> str:
    facts: list[tuple[str, Any]] = [
        ("state", state_badge(str(task.state))),
        ("type", task.type),
        ("queue", task.queue),
        ("priority", task.priority),
        ("attempts", f"{task.attempts} of {task.max_attempts}"),
        ("fence", tag("span", task.fence, id="fence")),
        ("owner", task.owner or "-"),
        ("key", task.key or "-"),
        ("created", f"{age(now - task.created_at)} ago"),
        ("due", age(task.run_at - now) if task.run_at > now else "now"),
    ]
    if task.lease_deadline is not None and task.state.owned:
        facts.append(("lease left", age(task.lease_deadline - now)))
    if task.limit_key is not None:
        notes = [f"at most {task.concurrency_limit} at once"] if task.concurrency_limit else []
        notes += ["fair share"] if task.fair else []
        facts.append(("limit key", task.limit_key + (f" ({', '.join(notes)})" if notes else "")))
    if task.depends_on:
        links = join((_edge(task, d, root) for d in task.depends_on), " ")
        facts.append(("depends on", links))
    if isinstance(task.progress, dict):
        facts.append(("progress", _progress(task.progress)))
    if why is not None:
        facts.append(
            (
                "why not running",
                tag("span", join([tag("code", why.blocker), " ", why.message]), id="why"),
            )
        )
    actions = []
    if task.state in RETRYABLE:
        actions.append(_button(task.id, "retry", csrf, root))
    if task.state in CANCELLABLE:
        actions.append(_button(task.id, "cancel", csrf, root))
    history = table(
        ["when", "event", "fence", "expert", "detail"],
        [
            (f"{age(now - e.at)} ago", e.event, e.fence, e.expert or "-", e.detail or "")
            for e in task.history
        ],
        id="history",
    )
    parts: list[Any] = [
        table(["", ""], facts, class_="facts", id="facts"),
        tag("div", join(actions), class_="actions"),
        tag("h2", "arguments"),
        pretty_json({"args": task.args, "kwargs": task.kwargs}),
    ]
    for name, value in (
        ("checkpoint", task.checkpoint),
        ("result", task.result),
        ("error", task.error),
    ):
        if value is not None:
            parts += [tag("h2", name), pretty_json(value)]
    parts += [tag("h2", "history (claims, commits, retries)"), history]
    return page(f"Task {task.id}", join(parts), root=root, active="tasks", note=note)


def competition(stats: StoreStats, *, root: str) -> str:
    rows = []
    for e in sorted(stats.experts, key=lambda e: e.info.id):
        if not e.alive:
            continue
        m = e.metrics
        window = m.get("window")
        on = "-"
        if e.info.tier == "emergency":
            on = "on" if m.get("active") else "standby"
        rows.append(
            (
                e.info.id,
                e.info.tier,
                on,
                f"{float(window) * 1000:.1f}ms" if isinstance(window, int | float) else "-",
                f"{float(m.get('cluster_load', 0) or 0):.0%}",
                e.claim_attempts,
                e.claims_won,
                percent(e.claims_won / e.claim_attempts if e.claim_attempts else None),
            )
        )
    rate = _rate(stats.experts)
    body = join(
        [
            tag(
                "p",
                join(
                    [
                        "cluster success rate (claims won / attempts): ",
                        tag("strong", live("success_rate", percent(rate))),
                        " — the seed notes call 85–95% healthy",
                    ]
                ),
            ),
            chart("success_rate", "competition success rate over time (live)"),
            table(
                [
                    "expert",
                    "tier",
                    "emergency",
                    "race window",
                    "cluster load",
                    "attempts",
                    "won",
                    "success",
                ],
                rows,
                id="competition",
            ),
        ]
    )
    return page("Competition", body, root=root, active="competition")


def login(refused: bool = False, *, root: str) -> str:
    form = tag(
        "form",
        join(
            [
                tag(
                    "label",
                    join(
                        [
                            "token ",
                            Safe('<input type="password" name="token" id="token" autofocus>'),
                        ]
                    ),
                ),
                tag("button", "open the dashboard", type="submit"),
            ]
        ),
        method="post",
        action=f"{root}/login",
    )
    note = "that token is not right" if refused else ""
    body = join([tag("p", "This dashboard asks for its token."), form])
    return page("Token needed", body, root=root, note=note)


def error(title: str, message: str, *, root: str) -> str:
    return page(title, tag("p", message), root=root)


def blocked_by_reason(counts: Mapping[tuple[str, Blocker], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, reason), n in counts.items():
        out[str(reason)] = out.get(str(reason), 0) + n
    return out
