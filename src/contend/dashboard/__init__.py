"""The web dashboard: ``contend dashboard --store URL`` (the ``dashboard`` extra).

Experts, queues, tasks (with why each pending one is not running, retry and cancel),
competition, a live throughput chart and ``/metrics``, read through the Store port alone.
See docs/dashboard.md.
"""

from __future__ import annotations

from contend.errors import MissingExtraError

try:
    import prometheus_client as _prometheus_client  # noqa: F401
    import starlette as _starlette  # noqa: F401
    import uvicorn as _uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise MissingExtraError("the dashboard", "dashboard", exc.name or "starlette") from exc

from contend.dashboard.app import check_root_path, create_app
from contend.dashboard.auth import ENV_TOKEN, check_bind
from contend.dashboard.serve import serve

__all__ = ["ENV_TOKEN", "check_bind", "check_root_path", "create_app", "serve"]
