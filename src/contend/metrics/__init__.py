"""Prometheus metrics: the expert's hook (:class:`MetricsHook`), the store's view for the
dashboard (``contend.metrics.store``) and a small server (:func:`serve_metrics`).

Needs the ``metrics`` extra (prometheus-client). Every metric is described in
docs/metrics.md.
"""

from __future__ import annotations

from contend.errors import MissingExtraError

try:
    import prometheus_client as _prometheus_client  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise MissingExtraError("Prometheus metrics", "metrics", "prometheus-client") from exc

from contend.metrics.expert import MetricsHook
from contend.metrics.server import MetricsServer, serve_metrics

__all__ = ["MetricsHook", "MetricsServer", "serve_metrics"]
