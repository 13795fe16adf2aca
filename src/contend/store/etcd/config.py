"""The store URL and its options: ``etcd://host:port[/prefix][?options]``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from contend.errors import ConfigError

#: Options an etcd URL may carry (``?max_txn_ops=1024&timeout=10``), with their parsers.
URL_OPTIONS: dict[str, Callable[[str], float | int]] = {
    "timeout": float,
    "max_txn_ops": int,
    "compact_after": float,
}
#: Seconds of etcd history kept by default: older revisions are compacted by expire().
COMPACT_AFTER = 60.0


def parse_etcd_url(url: str) -> tuple[str, int, str]:
    """``etcd://host:port[/prefix][?options]`` -> (host, port, key prefix ending in ``/``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"malformed etcd URL {url!r}: {exc}") from exc
    if parts.scheme != "etcd":
        raise ConfigError(f"not an etcd URL: {url!r}")
    if not parts.hostname:
        raise ConfigError(f"etcd URL {url!r} names no host; write etcd://host:2379")
    if parts.fragment or parts.username or parts.password:
        raise ConfigError(f"etcd URL {url!r}: fragments and credentials are not supported")
    prefix = parts.path.strip("/")
    if any(not seg for seg in prefix.split("/")) and prefix:
        raise ConfigError(f"etcd URL {url!r}: the key prefix has an empty segment")
    return parts.hostname, port or 2379, (prefix or "contend") + "/"


def etcd_url_options(url: str) -> dict[str, float | int]:
    """The options in an etcd URL's query; ConfigError for an unknown or malformed one."""
    out: dict[str, float | int] = {}
    query = urlsplit(url).query
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ConfigError(f"etcd URL {url!r}: malformed options ({exc})") from exc
    for name, value in pairs:
        parse = URL_OPTIONS.get(name)
        if parse is None:
            known = ", ".join(URL_OPTIONS)
            raise ConfigError(f"etcd URL {url!r}: unknown option {name!r} (known: {known})")
        if name in out:
            raise ConfigError(f"etcd URL {url!r}: option {name!r} given twice")
        try:
            out[name] = parse(value)
        except ValueError as exc:
            raise ConfigError(f"etcd URL {url!r}: option {name}={value!r} is not a number") from exc
    return out


@dataclass(frozen=True, slots=True)
class Options:
    """An etcd store's settings, from its URL and the keyword arguments of EtcdStore."""

    host: str
    port: int
    prefix: bytes  # every key lives under it; ends in b"/"
    timeout: float  # seconds per RPC
    max_txn_ops: int  # the cluster's --max-txn-ops: the operations one transaction may carry
    compact_after: float  # seconds of etcd history expire() keeps (0: never compacts)

    @classmethod
    def of(
        cls,
        url: str,
        *,
        timeout: float | None = None,
        max_txn_ops: int | None = None,
        compact_after: float | None = None,
    ) -> Options:
        """The settings of *url*, where an argument that is not None may also give one (it
        must then agree with the URL); ConfigError for a bad or conflicting one."""
        host, port, prefix = parse_etcd_url(url)
        options = etcd_url_options(url)
        given_options = (
            ("timeout", timeout),
            ("max_txn_ops", max_txn_ops),
            ("compact_after", compact_after),
        )
        for name, given in given_options:
            if given is not None and name in options and options[name] != given:
                raise ConfigError(
                    f"etcd {name} is {options[name]!r} in the URL but {given!r} as an argument"
                )
        timeout = timeout if timeout is not None else options.get("timeout", 5.0)
        max_txn_ops = (
            max_txn_ops if max_txn_ops is not None else int(options.get("max_txn_ops", 128))
        )
        if not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(f"etcd timeout must be a positive number of seconds, got {timeout!r}")
        if isinstance(max_txn_ops, bool) or not isinstance(max_txn_ops, int) or max_txn_ops < 16:
            raise ConfigError(f"max_txn_ops must be an integer >= 16, got {max_txn_ops!r}")
        compact_after = (
            compact_after
            if compact_after is not None
            else options.get("compact_after", COMPACT_AFTER)
        )
        if (
            not isinstance(compact_after, int | float)
            or not math.isfinite(compact_after)
            or compact_after < 0
        ):
            raise ConfigError(
                f"etcd compact_after must be a number of seconds >= 0 (0: never), "
                f"got {compact_after!r}"
            )
        return cls(host, port, prefix.encode(), float(timeout), max_txn_ops, float(compact_after))
