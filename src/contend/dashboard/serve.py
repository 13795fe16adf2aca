"""Running the dashboard: uvicorn on one address, after the bind check."""

from __future__ import annotations

import logging

import uvicorn

from contend.dashboard.app import check_root_path, create_app
from contend.dashboard.auth import check_bind
from contend.store.port import Store

log = logging.getLogger("contend.dashboard")


async def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    root_path: str = "",
) -> None:
    """Serve the dashboard over the open *store* until cancelled or interrupted; under the
    path prefix *root_path* (like ``/contend``) when a reverse proxy serves it there."""
    check_bind(host, token)
    root = check_root_path(root_path)
    app = create_app(store, token=token, root_path=root)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "dashboard at http://%s:%d%s/ (store %s)%s",
        shown,
        port,
        root,
        store.url,
        "; it asks for its token" if token else "",
    )
    await server.serve()
