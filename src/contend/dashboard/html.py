"""Server-rendered HTML in a few helpers: every value is escaped unless it is :class:`Safe`
(markup this module or a page built). No template engine, no front-end build."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

NAV = (
    ("/", "overview"),
    ("/experts", "experts"),
    ("/queues", "queues"),
    ("/tasks", "tasks"),
    ("/competition", "competition"),
)


class Safe(str):
    """Markup that is already escaped; adding text to it escapes the text."""

    __slots__ = ()

    def __add__(self, other: str) -> Safe:
        return Safe(str.__add__(self, esc(other)))


def esc(value: Any) -> Safe:
    if isinstance(value, Safe):
        return value
    return Safe(html.escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Safe:
    return Safe(sep.join(esc(p) for p in parts))


def tag(name: str, body: Any = "", /, **attrs: Any) -> Safe:
    """``<name attrs>body</name>``; attribute ``class_`` is ``class``, ``data_x`` is
    ``data-x``; None and False attributes are left out, True ones are bare."""
    shown = []
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        key = key.rstrip("_").replace("_", "-")
        shown.append(f" {key}" if value is True else f' {key}="{esc(value)}"')
    return Safe(f"<{name}{''.join(shown)}>{esc(body)}</{name}>")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], **attrs: Any) -> Safe:
    head = tag("tr", join(tag("th", h) for h in headers))
    body = join(tag("tr", join(tag("td", c) for c in row)) for row in rows)
    if not body:
        body = tag("tr", tag("td", "nothing here", colspan=len(headers), class_="empty"))
    return tag("table", join([tag("thead", head), tag("tbody", body)]), **attrs)


def live(key: str, value: Any) -> Safe:
    """A number the page's script refreshes from ``/api/live`` (``numbers[key]``)."""
    return tag("span", value, data_live=key)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 0:
        return f"in {age(-seconds)}"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def pretty_json(value: Any, limit: int = 20_000) -> Safe:
    text = json.dumps(value, indent=2, default=str)
    if len(text) > limit:
        text = text[:limit] + "\n… (cut)"
    return tag("pre", text)


def page(title: str, body: Any, *, root: str, active: str = "", note: str = "") -> str:
    """The whole document: header, navigation, *body*. *root* is the path prefix the
    dashboard is served under ("" for none, else like ``/contend``): every link of ours starts
    with it, and the page's script reads it from ``<html data-root>``."""
    nav = join(
        tag("a", label, href=root + href, class_="active" if label == active else None)
        for href, label in NAV
    )
    header = tag(
        "header",
        join(
            [
                tag("a", "contend", href=root + "/", class_="brand"),
                tag("nav", nav),
                tag("span", "", class_="clock", data_live="store_time"),
            ]
        ),
    )
    flash = tag("p", note, class_="flash", role="status") if note else Safe("")
    main = tag("main", join([tag("h1", title), flash, body]))
    head = join(
        [
            Safe('<meta charset="utf-8">'),
            Safe('<meta name="viewport" content="width=device-width, initial-scale=1">'),
            tag("title", f"{title} · contend"),
            Safe(f'<link rel="stylesheet" href="{esc(root)}/static/dashboard.css">'),
            Safe(f'<script src="{esc(root)}/static/dashboard.js" defer></script>'),
        ]
    )
    return "<!doctype html>\n" + tag(
        "html",
        join([tag("head", head), tag("body", join([header, main]))]),
        lang="en",
        data_root=root,
    )
