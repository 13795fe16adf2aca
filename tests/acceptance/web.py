"""Helpers for the tests that talk HTTP to a real ``contend dashboard``: a free port, waiting
for a server to answer, the store from another thread, the headless browser, and a small
reverse proxy that does what nginx does in front of the dashboard."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from contend.store.port import Store
from contend.store.registry import open_store

CHROMIUM = os.environ.get("CONTEND_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def need_browser() -> Any:
    """playwright's ``sync_playwright``, or a skip (a failure under CI=true) saying what is
    missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        missing = f"the playwright package is missing ({exc})"
    else:
        if os.access(CHROMIUM, os.X_OK):
            return sync_playwright
        missing = f"{CHROMIUM} is missing (scripts/install-chromium.sh installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {missing}")
    pytest.skip(f"{missing} (not under CI: there this is a failure)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def on_store(url: str, fn: Callable[[Store], Coroutine[Any, Any, Any]]) -> Any:
    """Run *fn* on the store in a thread of its own (the browser's driver owns this one)."""

    async def run() -> Any:
        store = await open_store(url)
        try:
            return await fn(store)
        finally:
            await store.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result(timeout=60)


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


#: Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1).
HOP_BY_HOP = frozenset(
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
     "upgrade", "proxy-authorization", "proxy-authenticate"]
)  # fmt: skip


class ReverseProxy:
    """What nginx does with ``location /contend/ { proxy_pass http://127.0.0.1:PORT/; }``:

    * a request under ``{prefix}/`` goes upstream with the prefix stripped (``/contend/tasks``
      becomes ``/tasks``, the query kept), its ``Host`` header as the client sent it (as
      ``proxy_set_header Host $http_host`` would; ``$host`` is the same on port 443), with
      ``X-Forwarded-For`` and ``X-Forwarded-Proto`` added and hop-by-hop headers dropped;
    * ``{prefix}`` alone is redirected to ``{prefix}/`` (nginx's 301), anything else gets the
      proxy's own 404;
    * the reply comes back as it is: status, every header (each ``Set-Cookie``), body.
      ``Location`` is not rewritten: nginx's ``proxy_redirect default`` only rewrites the
      upstream's own absolute URLs, which the dashboard never sends.

    ``forwarded`` lists the (method, path) of every request sent upstream."""

    def __init__(self, upstream_port: int, prefix: str = "/contend") -> None:
        self.upstream_port = upstream_port
        self.prefix = prefix
        self.forwarded: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ReverseProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            do_POST = do_HEAD = do_PUT = do_DELETE = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="test-reverse-proxy", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _reply(self, h: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
        h.send_response(status)
        for name, value in headers.items():
            h.send_header(name, value)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        path, _, query = h.path.partition("?")
        if path == self.prefix:
            self._reply(h, 301, {"Location": self.prefix + "/" + (f"?{query}" if query else "")})
            return
        if not path.startswith(self.prefix + "/"):
            self._reply(h, 404, {})
            return
        upstream_path = h.path[len(self.prefix) :]
        headers = [(k, v) for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP]
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers += [
            ("X-Forwarded-For", h.client_address[0]),
            ("X-Forwarded-Proto", "http"),
            ("Content-Length", str(len(body))),
        ]
        self.forwarded.append((h.command, upstream_path))
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        try:
            conn.putrequest(h.command, upstream_path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(body)
            reply = conn.getresponse()
            data = reply.read()
        except OSError:
            self._reply(h, 502, {})
            return
        finally:
            conn.close()
        h.send_response(reply.status, reply.reason)
        own = {"content-length", "server", "date"}  # this proxy writes its own
        for name, value in reply.getheaders():
            if name.lower() not in HOP_BY_HOP | own:
                h.send_header(name, value)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
