"""``HOST:PORT`` as users write it for gossip: seeds, and the address a member binds.

A host is an IP address (IPv6 in brackets, ``[fd00::5]:7946``) or a DNS name; a bind address
must be an IP address. Errors name the option or setting they came from.
"""

from __future__ import annotations

import ipaddress
import re

from contend.errors import ConfigError, shown

#: The most seeds one member is given.
MAX_SEEDS = 64
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _host_problem(host: str, ip_only: bool) -> str | None:
    if not host:
        return "has no host"
    if host.startswith("["):
        if not host.endswith("]"):
            return "has an unclosed '[' (an IPv6 address is written [fd00::5]:7946)"
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "has no IPv6 address between '[' and ']'"
        return None
    if ":" in host:
        return "has an IPv6 address without brackets (write [fd00::5]:7946)"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if ip_only:
        return "must bind an IP address (127.0.0.1, 0.0.0.0, [::1]), not a name"
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        return "has a host that is neither an IP address nor a DNS name"
    return None


def parse_hostport(text: str, what: str, *, bind: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT``; ConfigError naming *what* when it is malformed. A
    *bind* address must be an IP address and may take port 0 (any free port)."""
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be HOST:PORT text, got {shown(text)}")
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ConfigError(f"{what} takes HOST:PORT (e.g. 10.0.0.5:7946), got {shown(text)}")
    problem = _host_problem(host, bind)
    if problem is not None:
        raise ConfigError(f"{what}: {shown(text)} {problem}")
    lo = 0 if bind else 1
    if not port_text.isascii() or not port_text.isdigit() or not lo <= int(port_text) <= 65535:
        raise ConfigError(
            f"{what}: {shown(text)} has no port between {lo} and 65535 after the last ':'"
        )
    return host, int(port_text)


def parse_seeds(text: str, what: str) -> tuple[str, ...]:
    """``host:port,host:port,…`` as a tuple of normalised ``host:port`` (duplicates dropped,
    order kept); ConfigError naming *what* for an empty list or a malformed seed."""
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be HOST:PORT,… text, got {shown(text)}")
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ConfigError(f"{what} takes HOST:PORT,… (at least one seed), got {shown(text)}")
    return check_seeds([item for item in items if item], what)


def check_seeds(seeds: object, what: str) -> tuple[str, ...]:
    """A sequence of ``host:port`` seeds, each checked; the normalised tuple."""
    if isinstance(seeds, str) or not isinstance(seeds, list | tuple):
        raise ConfigError(f"{what} must be a list of HOST:PORT seeds, got {shown(seeds)}")
    out: list[str] = []
    for seed in seeds:
        host, port = parse_hostport(seed, what)
        normal = f"{host}:{port}"
        if normal not in out:
            out.append(normal)
    if len(out) > MAX_SEEDS:
        raise ConfigError(f"{what}: at most {MAX_SEEDS} seeds, got {len(out)}")
    return tuple(out)


def is_loopback(host: str) -> bool:
    """Whether *host* (an IP address, IPv6 possibly in brackets) is a loopback address."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
