"""The dashboard as an ASGI app (Starlette): pages, the live feed, actions and ``/metrics``.

It reads and acts through the Store port alone, so it works with every backend. Pages are
rendered on the server (``contend.dashboard.pages``); one small script of our own
(``static/dashboard.js``) polls ``/api/live`` each second to refresh the numbers marked live
and redraw the charts. Who may look and act is ``contend.dashboard.auth``'s business.

Behind a reverse proxy it may be served under a path prefix (``root_path="/contend"``): every
link, form, redirect, static URL, the live feed and the cookie carry the prefix, and a request
is answered with the prefix (a direct visit) or without it (a proxy that strips it, as nginx's
``proxy_pass http://127.0.0.1:8765/;`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from contend.dashboard import pages
from contend.dashboard.auth import COOKIE, Guard
from contend.dashboard.html import age, percent
from contend.dashboard.sampler import Sampler
from contend.domain.task import TaskState
from contend.errors import ConfigError, InvalidTransition, TaskNotFound
from contend.metrics.store import StoreMetrics, StoreSnapshot, read_snapshot
from contend.store.diagnosis import explain
from contend.store.port import Store, StoreStats

STATIC = Path(__file__).parent / "static"
#: How many tasks the tasks page reads (newest first, of the state, queue and type asked for)
#: before filtering by text.
SCAN = 2000
#: How many it shows.
SHOW = 200
#: How long counts of blocked tasks are reused, seconds (they list pending tasks).
BLOCKED_TTL = 5.0

Handler = Callable[[Request], Awaitable[Response]]

#: The first segment of each of the app's own paths: a root path may not begin with one (a
#: request for ``/tasks/…`` could not tell a prefix from a page).
OWN_PATHS = frozenset(
    ["experts", "queues", "competition", "tasks", "api", "metrics", "login", "static"]
)
_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")


def check_root_path(value: str, option: str = "root_path") -> str:
    """The path prefix *value* (``/contend``, ``/contend/``, ``/ops/contend``; "" or "/" for
    none) without its trailing slash, or a ConfigError naming *option*."""
    if value in ("", "/"):
        return ""
    if not value.startswith("/"):
        raise ConfigError(f"{option} must start with '/', like /contend: got {value!r}")
    segments = value[1:].removesuffix("/").split("/")
    for seg in segments:
        if not _SEGMENT.fullmatch(seg) or seg in (".", ".."):
            raise ConfigError(
                f"{option} may hold only letters, digits and . _ ~ - between single slashes "
                f"(one trailing slash is dropped): got {value!r}"
            )
    if segments[0] in OWN_PATHS:
        raise ConfigError(
            f"{option} {value!r} begins like the dashboard's own /{segments[0]} path: "
            "choose another prefix, like /contend"
        )
    return "/" + "/".join(segments)


class UnderRoot:
    """ASGI middleware that serves the app under *root*: whether a request came with the
    prefix or without it, the app sees ``root_path`` = *root* and ``path`` = *root* + the
    route's path, as the ASGI spec has it, so URLs Starlette builds carry the prefix too."""

    def __init__(self, app: ASGIApp, root: str) -> None:
        self.app = app
        self.root = root

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path: str = scope["path"]
            if path != self.root and not path.startswith(self.root + "/"):
                scope = dict(scope, path=self.root + path)
                raw = scope.get("raw_path")
                if raw is not None:
                    scope["raw_path"] = self.root.encode() + raw
            scope = dict(scope, root_path=self.root)
        await self.app(scope, receive, send)


def _root(request: Request) -> str:
    """The prefix this request's links carry ("" for none)."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def _route_path(request: Request) -> str:
    """The request's path inside the app, without the prefix."""
    path: str = request.scope["path"]
    root = _root(request)
    return path[len(root) :] if root and path.startswith(root) else path


class Dashboard:
    """The state behind the routes: the store, the guard, the sampler, cached counts."""

    def __init__(self, store: Store, guard: Guard, *, every: float = 1.0) -> None:
        self.store = store
        self.guard = guard
        self.sampler = Sampler(store, every)
        self.metrics = StoreMetrics()
        self._snapshot: StoreSnapshot | None = None
        self._snapshot_at = 0.0

    async def stats(self) -> StoreStats:
        """The store's stats, at most a sampling period and a half old."""
        return self.sampler.fresh() or await self.sampler.take()

    async def snapshot(self, fresh: bool = False) -> StoreSnapshot:
        if fresh or self._snapshot is None or time.monotonic() - self._snapshot_at > BLOCKED_TTL:
            self._snapshot = await read_snapshot(self.store, await self.stats())
            self._snapshot_at = time.monotonic()
        return self._snapshot

    # -- guards ------------------------------------------------------------------------------
    def allowed(self, request: Request) -> bool:
        return self.guard.allowed(request.cookies.get(COOKIE), request.headers.get("authorization"))

    def csrf(self, request: Request) -> str:
        return self.guard.csrf(request.cookies.get(COOKIE))

    def page(self, handler: Handler) -> Handler:
        """A page that needs the token (when there is one): else the token form."""

        async def guarded(request: Request) -> Response:
            if not self.allowed(request):
                if _route_path(request).startswith(("/api/", "/metrics")):
                    return JSONResponse({"error": "a token is needed"}, status_code=401)
                return RedirectResponse(_root(request) + "/login", status_code=303)
            return await handler(request)

        return guarded


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"cache-control": "no-store"})


async def _form(request: Request) -> dict[str, str]:
    body = (await request.body())[:65536].decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(body).items()}


def _live_numbers(d: Dashboard, stats: StoreStats, snap: StoreSnapshot) -> dict[str, Any]:
    n: dict[str, Any] = {"store_time": time.strftime("%H:%M:%S", time.localtime(stats.now))}
    for s in pages.STATES:
        n[f"total:{s}"] = sum(c.get(s, 0) for c in stats.counts.values())
    for q, counts in stats.counts.items():
        for s in pages.STATES:
            n[f"queue:{q}:{s}"] = counts.get(s, 0)
    for q, rate in d.sampler.queue_throughput().items():
        n[f"queue:{q}:throughput"] = f"{rate:.1f}/s"
    n["throughput"] = f"{stats.done_last_minute / 60:.1f}/s"
    n["oldest_pending"] = age(stats.oldest_pending_age)
    live = [e for e in stats.experts if e.alive]
    n["live_experts"] = len(live)
    attempts = sum(e.claim_attempts for e in live)
    n["success_rate"] = percent(sum(e.claims_won for e in live) / attempts if attempts else None)
    for e in stats.experts:
        key = f"expert:{e.info.id}"
        n[f"{key}:load"] = f"{e.load}/{e.info.capacity}"
        n[f"{key}:heartbeat"] = age(stats.now - e.heartbeat_at)
        n[f"{key}:won"] = e.claims_won
        n[f"{key}:lost"] = e.metrics.get("lost_races", e.claim_attempts - e.claims_won)
        n[f"{key}:done"] = e.tasks_done
    for reason, count in pages.blocked_by_reason(snap.blocked.counts).items():
        n[f"blocked:{reason}"] = count
    return n


class _Handlers:
    """The dashboard's pages and actions, one method a route."""

    def __init__(self, d: Dashboard) -> None:
        self.d = d
        self.store = d.store

    async def overview(self, request: Request) -> Response:
        snap = await self.d.snapshot()
        stats = await self.d.stats()
        blocked = pages.blocked_by_reason(snap.blocked.counts)
        return _html(pages.overview(stats, blocked, root=_root(request)))

    async def experts(self, request: Request) -> Response:
        return _html(pages.experts(await self.d.stats(), root=_root(request)))

    async def queues(self, request: Request) -> Response:
        stats = await self.d.stats()
        oldest = {q: (await self.store.backlog([q])).oldest_age for q in stats.counts}
        throughput = self.d.sampler.queue_throughput()
        return _html(pages.queues(stats, throughput, oldest, root=_root(request)))

    async def competition(self, request: Request) -> Response:
        return _html(pages.competition(await self.d.stats(), root=_root(request)))

    async def tasks(self, request: Request) -> Response:
        root = _root(request)
        qp = request.query_params
        state = qp.get("state") or None
        if state is not None and state not in pages.STATES:
            return _html(pages.error("Tasks", f"no such state: {state}", root=root), 400)
        f = pages.TaskFilter(
            state, qp.get("queue") or None, qp.get("type") or None, qp.get("q") or None
        )
        listed = await self.store.list_tasks(
            state=TaskState(state) if state else None,
            queue=f.queue,
            type=f.type,
            newest=True,
            limit=SCAN,
        )
        text = (f.text or "").lower()
        chosen = [t for t in listed if not text or text in _searchable(t)]
        now, experts_ = await self.store.now(), await self.store.list_experts()
        shown = chosen[:SHOW]
        keys = await self.store.key_states({t.limit_key for t in shown if t.limit_key is not None})
        found = [(t, explain(t, now, experts_, keys)) for t in shown]
        names = sorted((await self.d.stats()).counts)
        more = len(listed) >= SCAN or len(chosen) > SHOW
        return _html(pages.tasks(found, f, names, now, len(listed), more, root=root))

    async def task_detail(self, request: Request) -> Response:
        root = _root(request)
        task_id = request.path_params["task_id"]
        try:
            task = await self.store.get(task_id, history=True)
        except TaskNotFound:
            return _html(pages.error("Not found", f"no task {task_id}", root=root), 404)
        now, experts_ = await self.store.now(), await self.store.list_experts()
        keys = await self.store.key_states([task.limit_key] if task.limit_key is not None else [])
        note = request.query_params.get("note", "")[:200]
        why = explain(task, now, experts_, keys)
        return _html(pages.task_detail(task, why, now, self.d.csrf(request), note, root=root))

    async def act(self, request: Request) -> Response:
        root = _root(request)
        task_id, action = request.path_params["task_id"], request.path_params["action"]
        if action not in ("retry", "cancel"):
            return _html(pages.error("Not found", f"no action {action}", root=root), 404)
        if not self.d.allowed(request):
            refused = pages.error("Refused", "a token is needed to change a task", root=root)
            return _html(refused, 401)
        form = await _form(request)
        host = request.headers.get("host", "")
        if not self.d.guard.csrf_ok(
            request.cookies.get(COOKIE), form.get("csrf"), request.headers.get("origin"), host
        ):
            message = "the form's CSRF check failed: reload the page"
            return _html(pages.error("Refused", message, root=root), 403)
        try:
            task = await (self.store.retry if action == "retry" else self.store.cancel)(task_id)
        except TaskNotFound:
            return _html(pages.error("Not found", f"no task {task_id}", root=root), 404)
        except InvalidTransition as exc:
            return _html(pages.error("Not done", str(exc), root=root), 409)
        note = quote(f"{action}: the task is now {task.state}")
        return RedirectResponse(f"{root}/tasks/{task_id}?note={note}", status_code=303)

    async def api_live(self, request: Request) -> Response:
        stats = await self.d.stats()
        snap = await self.d.snapshot()
        points = [
            {"at": p.at, "throughput": p.throughput, "success_rate": p.success_rate}
            for p in self.d.sampler.points()[-300:]
        ]
        return JSONResponse({"numbers": _live_numbers(self.d, stats, snap), "points": points})

    async def metrics(self, request: Request) -> Response:
        self.d.metrics.update(await self.d.snapshot(fresh=True))
        return Response(generate_latest(self.d.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def login_form(self, request: Request) -> Response:
        root = _root(request)
        if not self.d.guard.required:
            return RedirectResponse(root + "/", status_code=303)
        return _html(pages.login(root=root))

    async def login(self, request: Request) -> Response:
        root = _root(request)
        form = await _form(request)
        if not self.d.guard.right_token(form.get("token", "")):
            return _html(pages.login(refused=True, root=root), 403)
        reply = RedirectResponse(root + "/", status_code=303)
        reply.set_cookie(
            COOKIE, self.d.guard.cookie_value(), path=root or "/", httponly=True, samesite="strict"
        )
        return reply


def routes(d: Dashboard) -> list[Route | Mount]:
    h, page = _Handlers(d), d.page
    return [
        Route("/", page(h.overview)),
        Route("/experts", page(h.experts)),
        Route("/queues", page(h.queues)),
        Route("/competition", page(h.competition)),
        Route("/tasks", page(h.tasks)),
        Route("/tasks/{task_id}", page(h.task_detail)),
        Route("/tasks/{task_id}/{action}", h.act, methods=["POST"]),
        Route("/api/live", page(h.api_live)),
        Route("/metrics", page(h.metrics)),
        Route("/login", h.login_form, methods=["GET"]),
        Route("/login", h.login, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


def _searchable(task: Any) -> str:
    parts = [task.id, task.type, task.owner or "", task.key or ""]
    parts += [json.dumps(v) for v in (task.args, task.kwargs, task.error, task.result) if v]
    return " ".join(parts).lower()


def create_app(
    store: Store, *, token: str | None = None, every: float = 1.0, root_path: str = ""
) -> Starlette:
    """The dashboard over an open *store*; *token* None asks for none (loopback only).
    *root_path* (like ``/contend``) is the prefix it is served under behind a proxy; give it
    here and not to the ASGI server as well."""
    root = check_root_path(root_path)
    d = Dashboard(store, Guard(token), every=every)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampling = asyncio.create_task(d.sampler.run(), name="contend-dashboard-sampler")
        try:
            yield
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling

    middleware = [Middleware(UnderRoot, root=root)] if root else []
    app = Starlette(routes=routes(d), middleware=middleware, lifespan=lifespan)
    app.state.dashboard = d
    return app
