"""The store URL: the libpq part, contend's own options in its query string, and a form of it
that is safe to print."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg.conninfo

from contend.errors import ConfigError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
_OPTIONS = {"schema", "listen", "listen_url", "pgbouncer", "pool_size", "idle_tx_timeout"}
#: Seconds the server lets one of the store's own connections sit idle inside a transaction
#: before it ends that session (``idle_tx_timeout``): a frozen expert frees its rows then.
IDLE_TX_TIMEOUT = 5.0
TRUE, FALSE = {"1", "true", "on", "yes"}, {"0", "false", "off", "no"}


def parse_postgres_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a store URL into the libpq URL and contend's own options (validated)."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"malformed PostgreSQL URL {url!r}: {exc}") from exc
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"not a PostgreSQL URL: {url!r}")
    opts = {k: v for k, v in query if k in _OPTIONS}
    rest = [(k, v) for k, v in query if k not in _OPTIONS]
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ConfigError(f"malformed PostgreSQL URL {url!r}: {exc}") from exc
    schema = opts.setdefault("schema", "contend")
    if not _IDENT.match(schema):
        raise ConfigError(
            f"PostgreSQL URL {url!r}: schema {schema!r} must be letters, digits and _ "
            "(at most 41 characters, not starting with a digit)"
        )
    for flag in ("listen", "pgbouncer"):
        if flag in opts and opts[flag].lower() not in TRUE | FALSE:
            raise ConfigError(f"PostgreSQL URL {url!r}: {flag} must be true or false")
    if "pool_size" in opts and not (opts["pool_size"].isdigit() and int(opts["pool_size"]) > 0):
        raise ConfigError(f"PostgreSQL URL {url!r}: pool_size must be a positive integer")
    if "idle_tx_timeout" in opts:
        idle_tx_timeout(opts, url)
    if "listen_url" in opts:
        listen_parts = urlsplit(opts["listen_url"])
        if listen_parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"PostgreSQL URL {url!r}: listen_url must be a postgresql:// URL")
    return dsn, opts


def idle_tx_timeout(opts: dict[str, str], url: str = "") -> float:
    """The ``idle_tx_timeout`` option in seconds (0: the server's own setting), checked."""
    text = opts.get("idle_tx_timeout")
    if text is None:
        return IDLE_TX_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:
        raise ConfigError(
            f"PostgreSQL URL {url!r}: idle_tx_timeout must be a number of seconds from 0 "
            f"(the server's setting) to 86400, not {text!r}"
        )
    return value


def safe(dsn: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if "@" in netloc:
        cred, _, host = netloc.rpartition("@")
        netloc = f"{cred.split(':', 1)[0]}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
