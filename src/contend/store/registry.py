"""The one place that turns a store URL into a backend."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from contend.errors import ConfigError, MissingExtraError
from contend.store.port import Store

# scheme -> (module, class, extra, the packages the extra brings)
BACKENDS: dict[str, tuple[str, str, str | None, tuple[str, ...]]] = {
    "memory": ("contend.store.memory", "MemoryStore", None, ()),
    "sqlite": ("contend.store.sqlite", "SQLiteStore", None, ()),
    "postgresql": ("contend.store.postgres", "PostgresStore", "postgres", ("psycopg",)),
    "postgres": ("contend.store.postgres", "PostgresStore", "postgres", ("psycopg",)),
    "etcd": ("contend.store.etcd", "EtcdStore", "etcd", ("aetcd", "orjson")),
}


def make_store(url: str, *, clock: Callable[[], float] | None = None, **options: Any) -> Store:
    """Build (but do not open) the backend for *url*. Raises ConfigError for a bad URL."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("a store URL is needed: pass --store, set CONTEND_STORE, or App(url)")
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:
        raise ConfigError(f"malformed store URL {url!r}: {exc}") from exc
    if scheme not in BACKENDS:
        known = ", ".join(f"{s}://" for s in ("sqlite", "postgresql", "etcd", "memory"))
        raise ConfigError(f"unknown store URL {url!r}: it must start with one of {known}")
    module_name, class_name, extra, packages = BACKENDS[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0]
        if extra is not None and any(missing.startswith(p) for p in packages):
            raise MissingExtraError(f"the {scheme} store", extra, missing) from exc
        raise
    cls = getattr(module, class_name)
    if clock is not None:
        options["clock"] = clock
    store: Store = cls(url, **options)
    return store


async def open_store(url: str, **options: Any) -> Store:
    store = make_store(url, **options)
    await store.open()
    return store
