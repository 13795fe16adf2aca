"""The SQLite store's URL: ``sqlite:///path`` and its options."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from contend.errors import ConfigError

#: The ``?synchronous=`` values and the PRAGMA each sets.
SYNC_MODES = {"off": "OFF", "normal": "NORMAL", "full": "FULL", "extra": "EXTRA"}


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite:///:memory:`` is refused
    (processes could not share it)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise ConfigError(f"not an SQLite URL: {url!r}")
    if not url[len("sqlite:") :].startswith("//"):
        # sqlite:/x.db and sqlite:x.db would be read as a relative x.db: say so, do not guess
        raise ConfigError(
            f"SQLite URL {url!r} needs three slashes before a relative path and four before an "
            "absolute one: sqlite:///relative.db or sqlite:////absolute/path.db"
        )
    if parts.netloc:
        raise ConfigError(
            f"SQLite URL {url!r} has a host part {parts.netloc!r}; write sqlite:///relative.db "
            "or sqlite:////absolute/path.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path.endswith("/"):
        raise ConfigError(f"SQLite URL {url!r} names no file; write sqlite:///path/to/file.db")
    if path == ":memory:":
        raise ConfigError("sqlite:///:memory: cannot be shared between experts; use memory://")
    opts = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(opts) - {"synchronous"}
    if unknown:
        raise ConfigError(f"SQLite URL {url!r}: unknown option(s) {sorted(unknown)}")
    if "synchronous" in opts and opts["synchronous"].lower() not in SYNC_MODES:
        raise ConfigError(f"SQLite URL {url!r}: synchronous must be one of {sorted(SYNC_MODES)}")
    return path, opts


def sync_pragma(opts: dict[str, str]) -> str:
    """The ``PRAGMA synchronous`` value the URL's options ask for (``NORMAL`` by default)."""
    return SYNC_MODES[opts.get("synchronous", "normal").lower()]
