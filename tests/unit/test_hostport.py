"""Gossip addresses: HOST:PORT checked with an error that names where it came from."""

from __future__ import annotations

import re

import pytest

from contend.domain.hostport import check_seeds, is_loopback, parse_hostport, parse_seeds
from contend.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7946", ("127.0.0.1", 7946)),
        ("node-1.example.com:1", ("node-1.example.com", 1)),
        ("[fd00::5]:7946", ("[fd00::5]", 7946)),
        (" 10.0.0.5:65535 ", ("10.0.0.5", 65535)),
        ("localhost:7946", ("localhost", 7946)),
    ],
)
def test_good_seeds(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text, "--gossip") == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("127.0.0.1", "takes HOST:PORT"),
        (":7946", "has no host"),
        ("127.0.0.1:", "has no port between 1 and 65535"),
        ("127.0.0.1:0", "has no port between 1 and 65535"),
        ("127.0.0.1:65536", "has no port"),
        ("127.0.0.1:x", "has no port"),
        ("127.0.0.1:٣", "has no port"),  # a digit, but not an ASCII one
        ("fd00::5:7946", "without brackets"),
        ("[fd00::5:7946", "unclosed"),
        ("[nope]:7946", "no IPv6 address"),
        ("bad_host!:7946", "neither an IP address nor a DNS name"),
        ("-lead.example:7946", "neither an IP address nor a DNS name"),
    ],
)
def test_bad_seeds_name_the_option(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="--gossip") as err:
        parse_hostport(text, "--gossip")
    assert problem in str(err.value)


def test_a_bind_address_is_an_ip_and_may_take_any_port() -> None:
    assert parse_hostport("127.0.0.1:0", "--gossip-bind", bind=True) == ("127.0.0.1", 0)
    assert parse_hostport("0.0.0.0:7946", "--gossip-bind", bind=True) == ("0.0.0.0", 7946)
    with pytest.raises(
        ConfigError, match=re.escape("--gossip-bind: 'example.com:1' must bind an IP")
    ):
        parse_hostport("example.com:1", "--gossip-bind", bind=True)


def test_a_seed_list() -> None:
    assert parse_seeds("10.0.0.5:7946, 10.0.0.6:7946,,10.0.0.5:7946", "--gossip") == (
        "10.0.0.5:7946",
        "10.0.0.6:7946",
    )
    for bad in ("", " , ", ","):
        with pytest.raises(
            ConfigError, match=re.escape("--gossip takes HOST:PORT,… (at least one seed)")
        ):
            parse_seeds(bad, "--gossip")
    with pytest.raises(ConfigError, match="gossip must be a list"):
        check_seeds("10.0.0.5:7946", "gossip")
    with pytest.raises(ConfigError, match="at most 64 seeds"):
        check_seeds([f"10.0.0.1:{p}" for p in range(1, 70)], "gossip")


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5")
