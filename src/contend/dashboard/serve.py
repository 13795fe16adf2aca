"""Running the dashboard: uvicorn on one address, after the bind check."""

from __future__ import annotations

import logging

import uvicorn

from contend.dashboard.app import create_app
from contend.dashboard.auth import check_bind
from contend.store.port import Store

log = logging.getLogger("contend.dashboard")


async def serve(
    store: Store, *, host: str = "127.0.0.1", port: int = 8765, token: str | None = None
) -> None:
    """Serve the dashboard over the open *store* until cancelled or interrupted."""
    check_bind(host, token)
    app = create_app(store, token=token)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "dashboard at http://%s:%d/ (store %s)%s",
        shown,
        port,
        store.url,
        "; it asks for its token" if token else "",
    )
    await server.serve()
