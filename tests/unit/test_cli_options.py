"""``contend expert``'s options come from ExpertConfig: same defaults, same bounds, and
``--help`` and docs/reference.md show them, so the CLI and the config cannot drift apart."""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from contend.cli.expert import CONVERSIONS, config_from_args, options
from contend.cli.main import build_parser, main
from contend.domain.scoring import default_fitness
from contend.domain.task import Capabilities
from contend.errors import ConfigError
from contend.runtime.config import ExpertConfig, setting_of

REFERENCE = Path(__file__).parents[2] / "docs" / "reference.md"
# The options `contend expert` has always had; a field that loses its flag fails here.
FLAGS = {
    "--name",
    "--concurrency",
    "--queue",
    "--capability",
    "--tier",
    "--specialty",
    "--lease",
    "--window",
    "--grace",
    "--fitness",
    "--zone-margin",
    "--auction-window",
    "--prefetch",
    "--claim-ahead",
    "--steal-ratio",
    "--retention",
    "--gossip",
    "--gossip-bind",
    "--gossip-timing",
}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["expert", "mod:app", *argv])


def field_default(name: str) -> Any:
    (f,) = [f for f in fields(ExpertConfig) if f.name == name]
    return f.default_factory() if f.default is MISSING else f.default


def test_the_exposed_fields_are_the_cli_options() -> None:
    assert {s.flag for _, s in options()} == FLAGS
    for f in fields(ExpertConfig):
        setting_of(f)  # every field documents itself


def test_every_default_is_the_cli_default() -> None:
    args = parse()
    for f, _ in options():
        if f.name not in CONVERSIONS:
            assert getattr(args, f.name) == field_default(f.name), f.name
        else:  # not given: the conversion is skipped and the field keeps its default
            assert getattr(args, f.name) is None, f.name
    assert config_from_args(args) == ExpertConfig()


def _help_entries(text: str) -> dict[str, str]:
    """``--help`` per option, by its first flag, with the wrapping undone."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in [*text.splitlines(), "  -end"]:
        if re.match(r"^  -", line) and current:
            joined = " ".join(" ".join(current).split())
            entries[joined.split()[0].rstrip(",")] = joined
            current = []
        if current or re.match(r"^  -", line):
            current.append(line)
    return entries


def test_help_lists_every_option_with_the_configs_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # unwrapped: argparse breaks lines at hyphens
    with pytest.raises(SystemExit) as done:
        main(["expert", "--help"])
    assert done.value.code == 0
    entries = _help_entries(capsys.readouterr().out)
    for f, s in options():
        value = field_default(f.name)
        if s.default_text is not None:
            shown = s.default_text
        elif isinstance(value, float):
            shown = f"{value:g}"
        else:
            shown = str(value)
        assert f"(default: {shown})" in entries[str(s.flag)], entries[str(s.flag)]
    assert "--no-steal" in entries


def _outside(lo: float, hi: float, integer: bool) -> list[float]:
    step = 1 if integer else (hi - lo) / 1000 or 0.001
    return [lo - step, hi + step]


def test_the_cli_and_validate_hold_a_field_to_the_same_bounds() -> None:
    bounded = [(f, s) for f, s in options() if s.bounds is not None]
    assert len(bounded) >= 8
    for f, s in bounded:
        assert s.bounds is not None and s.flag is not None
        integer = isinstance(field_default(f.name), int)
        for bad in _outside(s.bounds.lo, s.bounds.hi, integer):
            value = int(bad) if integer else bad
            with pytest.raises(SystemExit):
                parse(s.flag, str(value))
            with pytest.raises(ConfigError, match=f.name):
                ExpertConfig(**{f.name: value}).validate()
        edges = [s.bounds.hi] if s.bounds.lo_open else [s.bounds.lo, s.bounds.hi]
        for good in edges:
            value = int(good) if integer else good
            assert getattr(parse(s.flag, str(value)), f.name) == value
            ExpertConfig(**{f.name: value}).validate()


def test_a_refused_option_names_itself_and_its_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, message in [
        (["--lease", "0"], "--lease must be between 0.5 and 86400, got 0"),
        (["--concurrency", "x"], "--concurrency must be an integer, got 'x'"),
        (["--steal-ratio", "0"], "--steal-ratio must be in (0, 1], got 0"),
        (["--window", "nan"], "--window must be between 0 and 60, got nan"),
    ]:
        with pytest.raises(SystemExit) as done:
            parse(*argv)
        assert done.value.code == 2
        assert message in capsys.readouterr().err


def test_conversions_build_the_fields() -> None:
    config = config_from_args(
        parse(
            "--capability",
            "gpu",
            "--capability",
            "mem_gb=16",
            "-q",
            "a",
            "--queue",
            "b",
            "--specialty",
            "render",
            "--fitness",
            "contend.domain.scoring:default_fitness",
            "--no-steal",
            "-c",
            "3",
            "--tier",
            "specialized",
        )
    )
    assert config.capabilities == Capabilities.parse(["gpu", "mem_gb=16"])
    assert config.capabilities.tags == frozenset({"gpu"})
    assert config.queues == ["a", "b"]
    assert config.specialties == frozenset({"render"})
    assert config.fitness is default_fitness
    assert config.steal_ratio is None
    assert config.concurrency == 3 and config.tier == "specialized"


def test_reference_lists_exactly_the_expert_options() -> None:
    (line,) = [
        ln for ln in REFERENCE.read_text().splitlines() if ln.startswith("| `contend expert ")
    ]
    listed = set(re.findall(r"--[a-z][a-z-]*", line))
    assert listed == FLAGS | {
        "--no-steal",
        "--no-periodic",
        "--store",
        "--metrics-port",
        "--metrics-host",
    }


def test_gossip_options_build_the_fields_and_refuse_bad_addresses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = config_from_args(
        parse("--gossip", "10.0.0.5:7946, 10.0.0.6:7946", "--gossip-bind", "0.0.0.0:7946")
    )
    assert config.gossip == ("10.0.0.5:7946", "10.0.0.6:7946")
    assert config.gossip_bind == "0.0.0.0:7946"
    assert config.gossip_timing == "lan"
    for argv, message in [
        (["--gossip", "10.0.0.5"], "--gossip takes HOST:PORT (e.g. 10.0.0.5:7946), got '10.0.0.5'"),
        (["--gossip", "10.0.0.5:99999"], "--gossip: '10.0.0.5:99999' has no port between 1 and"),
        (["--gossip", ","], "--gossip takes HOST:PORT,… (at least one seed), got ','"),
        (["--gossip-bind", "example.com:1"], "--gossip-bind: 'example.com:1' must bind an IP"),
        (["--gossip-timing", "slow"], "invalid choice: 'slow'"),
    ]:
        with pytest.raises(SystemExit) as done:
            parse(*argv)
        assert done.value.code == 2
        assert message in capsys.readouterr().err


def test_gossip_settings_are_checked_from_python_too() -> None:
    ExpertConfig(gossip=("127.0.0.1:7946",)).validate()
    for bad, message in [
        ({"gossip": "127.0.0.1:7946"}, "gossip must be a list of HOST:PORT seeds"),
        ({"gossip": ("127.0.0.1",)}, "gossip takes HOST:PORT"),
        ({"gossip_bind": "127.0.0.1"}, "gossip_bind takes HOST:PORT"),
        ({"gossip_timing": "slow"}, "gossip_timing must be lan, wan or fast"),
        ({"gossip_keys": "abc"}, "gossip_keys must be a list"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            ExpertConfig(**bad).validate()
    assert "secret" not in repr(ExpertConfig(gossip_keys=("secret",)))


def test_supervise_passes_the_gossip_options_on_as_given() -> None:
    from contend.cli.supervise import expert_options

    args = build_parser().parse_args(
        [
            "supervise",
            "-n",
            "2",
            "mod:app",
            "--gossip",
            "10.0.0.5:7946,10.0.0.6:7946",
            "--gossip-timing",
            "fast",
        ]
    )
    out = expert_options(args)
    assert out[out.index("--gossip") + 1] == "10.0.0.5:7946,10.0.0.6:7946"
    assert out[out.index("--gossip-timing") + 1] == "fast"
    assert "--gossip-bind" not in out  # each child binds a free port of its own


def test_supervise_refuses_one_gossip_port_for_many_experts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(
            ["supervise", "-n", "2", "tests.acceptance.sample_app:app", "--store",
             "sqlite:///x.db", "--gossip", "127.0.0.1:7946", "--gossip-bind", "127.0.0.1:7946"]
        )  # fmt: skip
    assert done.value.code == 2
    assert "cannot all bind one port" in capsys.readouterr().err
