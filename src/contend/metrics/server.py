"""Serving a registry on ``/metrics`` for Prometheus to scrape.

The server is prometheus-client's own (a small WSGI server on a thread of its own);
:class:`MetricsServer` is the handle that stops it. It binds to 127.0.0.1 unless told
otherwise: metrics name task types, queues and experts, which are nobody else's business.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from contend.errors import ConfigError

log = logging.getLogger("contend.metrics")


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve *registry* at ``http://host:port/metrics`` (port 0: any free one)."""
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    handle = MetricsServer(server, thread)
    log.info("metrics at http://%s:%d/metrics", host, handle.port)
    return handle
