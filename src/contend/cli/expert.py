"""``contend expert``: run one expert until SIGTERM or SIGINT (a second signal stops it now)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import Field, fields
from typing import Any

from contend.cli.common import (
    Subcommands,
    UsageError,
    add_store_option,
    bounded,
    int_in,
    load_app,
    load_callable,
    queue_arg,
    resolve_store_url,
    text_arg,
)
from contend.domain.hostport import parse_hostport, parse_seeds
from contend.domain.task import Capabilities
from contend.errors import ConfigError, TaskError
from contend.runtime.config import (
    ExpertConfig,
    Setting,
    field_types,
    number_text,
    setting_of,
    value_type,
)
from contend.runtime.hooks import Hook

log = logging.getLogger("contend.cli")


def _capabilities(items: list[str]) -> Capabilities:
    try:
        return Capabilities.parse(items)
    except TaskError as exc:
        raise UsageError(str(exc)) from exc


def _fitness(target: str) -> Any:
    return load_callable(target, "--fitness")


def _retention(text: str) -> float | None:
    """``--retention 7d`` (an age: 90s, 15m, 12h, 7d, 2w) or ``--retention off``."""
    from contend.cli.prune import duration

    if text.strip().lower() in ("off", "none", "never"):
        return None
    try:
        return duration(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"--retention: {exc} (or off)") from None


def _checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type that refuses what *check* refuses, with its message (which names the
    option), and keeps the text: ``contend supervise`` passes it on to its experts as given."""

    def parse(text: str) -> str:
        try:
            check(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return parse


def _gossip_seeds(text: str) -> tuple[str, ...]:
    return parse_seeds(text, "--gossip")


def _gossip_bind(text: str) -> str:
    host, port = parse_hostport(text, "--gossip-bind", bind=True)
    return f"{host}:{port}"


# The options whose text becomes the field's value by a conversion of its own. They default to
# None, meaning "not given: the field's default". Every other option takes its type, bounds,
# choices and default from the field.
CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "queues": list,  # --queue a --queue b
    "capabilities": _capabilities,  # --capability gpu --capability mem_gb=16
    "specialties": frozenset,  # --specialty render --specialty encode
    "fitness": _fitness,  # --fitness MODULE:FUNCTION
    "retention": _retention,  # --retention 7d | off
    "gossip": _gossip_seeds,  # --gossip 10.0.0.5:7946,10.0.0.6:7946
    "gossip_bind": _gossip_bind,  # --gossip-bind 0.0.0.0:7946
}


# The repeated options whose every value is checked as it is read (ExpertConfig.validate holds
# a config from Python to the same rule).
ITEM_TYPES: dict[str, Callable[[str], Any]] = {
    "queues": queue_arg(),
    "gossip": _checked(_gossip_seeds),
    "gossip_bind": _checked(_gossip_bind),
}


def options() -> list[tuple[Field[Any], Setting]]:
    """The fields of ExpertConfig that ``contend expert`` exposes, with their settings."""
    return [(f, s) for f in fields(ExpertConfig) if (s := setting_of(f)).flag]


def option(name: str) -> tuple[Field[Any], Setting]:
    """The exposed field ``name`` and its setting, for a command that passes it on."""
    (found,) = [(f, s) for f, s in options() if f.name == name]
    return found


def default_text(f: Field[Any], s: Setting) -> str:
    """How ``--help`` words a field's default."""
    if s.default_text is not None:
        return s.default_text
    if isinstance(f.default, int | float):
        return number_text(f.default)
    return str(f.default)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """One option per exposed field of ExpertConfig, in the order of the fields."""
    types = field_types()
    for f, s in options():
        assert s.flag is not None
        flags = [s.flag] if s.short is None else [s.flag, s.short]
        given: dict[str, Any] = {
            "dest": f.name,
            "metavar": s.metavar or s.flag.lstrip("-").upper().replace("-", "_"),
            "help": f"{s.help} (default: {default_text(f, s)})".replace("%", "%%"),
        }
        if s.repeat:
            given["action"] = "append"
        if f.name in CONVERSIONS:
            given["default"] = None
            if f.name in ITEM_TYPES:
                given["type"] = ITEM_TYPES[f.name]
        else:
            kind = value_type(types[f.name])
            given["default"] = f.default
            if kind is not str:
                given["type"] = bounded(s.flag, kind, s.bounds)
            if s.choices:
                given["choices"] = s.choices
                given["metavar"] = None  # argparse shows {a,b,c}
        parser.add_argument(*flags, **given)


def config_from_args(args: argparse.Namespace) -> ExpertConfig:
    """The ExpertConfig that the options ask for; an option not given leaves its default."""
    values: dict[str, Any] = {}
    for f, _ in options():
        given = getattr(args, f.name)
        if f.name not in CONVERSIONS:
            values[f.name] = given
        elif given is not None:
            values[f.name] = CONVERSIONS[f.name](given)
    if args.no_steal:
        values["steal_ratio"] = None
    if getattr(args, "no_periodic", False):
        values["periodic"] = False
    return ExpertConfig(**values)


def add_parser(sub: Subcommands) -> None:
    e = sub.add_parser("expert", help="run an expert until SIGTERM")
    e.add_argument("app", help="MODULE:APP")
    add_store_option(e)
    add_config_options(e)
    e.add_argument(
        "--no-steal", action="store_true", help="never take unstarted tasks from other experts"
    )
    e.add_argument(
        "--no-periodic",
        action="store_true",
        help="do not submit the ticks of the app's periodic tasks (other experts do)",
    )
    add_metrics_options(e)
    e.set_defaults(func=cmd_expert)


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int_in("--metrics-port", 0, 65535),
        help="serve Prometheus metrics on this port (0: any free one; needs the metrics extra)",
    )
    parser.add_argument(
        "--metrics-host",
        type=text_arg("--metrics-host"),
        default="127.0.0.1",
        help="the address the metrics endpoint binds to (default: 127.0.0.1)",
    )


def metrics_hooks(args: argparse.Namespace) -> tuple[list[Hook], Callable[[], None]]:
    """The metrics hook and a function that stops its server, when --metrics-port is given."""
    if args.metrics_port is None:
        return [], lambda: None
    from contend.metrics import MetricsHook, serve_metrics

    hook = MetricsHook()
    server = serve_metrics(hook.registry, args.metrics_port, args.metrics_host)
    return [hook], server.close


async def cmd_expert(args: argparse.Namespace) -> int:
    from contend.runtime.expert import Expert

    app = load_app(args.app)
    url = resolve_store_url(args, app)
    app.with_store(url)
    config = config_from_args(args)
    hooks, stop_metrics = metrics_hooks(args)
    expert = Expert(app, config, hooks=hooks)
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            log.info(
                "signal %s: stopping gracefully (again to stop now)", signal.Signals(signum).name
            )
            expert.stop()
        else:
            log.warning("second signal: stopping now")
            expert.config.grace = 0
            expert.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await expert.run()
    finally:
        stop_metrics()
        await app.aclose()
    return 0
