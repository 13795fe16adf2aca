"""How an expert behaves: every setting, its default and its check, in one place.

Each field of :class:`ExpertConfig` carries a :class:`Setting` in its ``metadata``: what it means,
the bounds or choices :meth:`ExpertConfig.validate` holds it to, and, for the fields
``contend expert`` exposes, the option's spelling. The CLI builds its options from these, so a
default or a bound changes here and nowhere else.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any

from contend.domain import auction
from contend.domain.hostport import check_seeds, parse_hostport
from contend.domain.payload import check_name, check_queue
from contend.domain.retention import DEFAULT_RETENTION, check_retention
from contend.domain.scoring import Fitness, default_fitness
from contend.domain.task import Capabilities
from contend.errors import ConfigError, TaskError, shown
from contend.gossip.node import TIMINGS as GOSSIP_TIMINGS
from contend.runtime.competition import PressurePolicy

SETTING = "contend"  # the key of a field's Setting in its metadata


def number_text(x: float) -> str:
    """A number as people write it: 86400 and 15, not 86400.0 and 15.0."""
    return str(int(x)) if math.isfinite(x) and x == int(x) else str(x)


@dataclass(frozen=True)
class Bounds:
    """The values a number may take: ``[lo, hi]``, or ``(lo, hi]`` when ``lo_open``."""

    lo: float
    hi: float
    lo_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        return above and value <= self.hi  # NaN is in no bounds

    def __str__(self) -> str:
        if self.lo_open:
            return f"in ({number_text(self.lo)}, {number_text(self.hi)}]"
        return f"between {number_text(self.lo)} and {number_text(self.hi)}"


@dataclass(frozen=True)
class Setting:
    """What the checks and the command line know about one field of ExpertConfig."""

    help: str
    bounds: Bounds | None = None
    choices: tuple[str, ...] = ()
    flag: str | None = None  # the ``contend expert`` option; None: set from Python only
    short: str | None = None
    metavar: str | None = None
    repeat: bool = False  # the option may be given many times, each adding one value
    default_text: str | None = None  # how ``--help`` words a default that is not a plain value


def setting(help: str, **kwargs: Any) -> Mapping[str, Setting]:
    """A field's ``metadata``: ``field(default=…, metadata=setting("what it means", …))``."""
    return {SETTING: Setting(help, **kwargs)}


def setting_of(f: Field[Any]) -> Setting:
    found = f.metadata.get(SETTING)
    if not isinstance(found, Setting):
        raise TypeError(f"ExpertConfig.{f.name} has no Setting in its metadata")
    return found


TIERS = ("general", "specialized", "emergency")
ONE_DAY = 86_400


@dataclass
class ExpertConfig:
    """How an expert behaves. Every field has a sensible default."""

    name: str | None = field(
        default=None,
        metadata=setting(
            "expert id; must not be live elsewhere", flag="--name", default_text="host-pid"
        ),
    )
    concurrency: int = field(
        default=8,
        metadata=setting(
            "tasks run at once", bounds=Bounds(1, 10_000), flag="--concurrency", short="-c"
        ),
    )
    queues: Sequence[str] | None = field(
        default=None,
        metadata=setting(
            "a queue to claim from; repeat for more",
            flag="--queue",
            short="-q",
            metavar="QUEUE",
            repeat=True,
            default_text="the queues of the app's task types",
        ),
    )
    capabilities: Capabilities = field(
        default_factory=Capabilities,
        metadata=setting(
            "a tag this expert has, or a resource and its amount; repeat for more",
            flag="--capability",
            metavar="TAG|NAME=AMOUNT",
            repeat=True,
            default_text="none",
        ),
    )
    tier: str = field(
        default="general",
        metadata=setting(
            "specialized: the edge on its specialties (none named: its app's types); "
            "emergency: claims only under pressure",
            choices=TIERS,
            flag="--tier",
        ),
    )
    specialties: frozenset[str] = field(
        default=frozenset(),
        metadata=setting(
            "a task type this expert is best at; repeat for more",
            flag="--specialty",
            metavar="TASK_TYPE",
            repeat=True,
            default_text="none",
        ),
    )
    retention: float | None = field(
        default=DEFAULT_RETENTION,
        metadata=setting(
            "how long finished tasks are kept before housekeeping prunes them: an age "
            "(90s, 15m, 12h, 7d, 2w) or off",
            flag="--retention",
            metavar="AGE",
            default_text="7d",
        ),
    )
    periodic: bool = field(  # --no-periodic
        default=True,
        metadata=setting("submit the ticks of the app's periodic task types (@app.periodic)"),
    )
    lease_ttl: float = field(
        default=15.0,
        metadata=setting("lease TTL in seconds", bounds=Bounds(0.5, ONE_DAY), flag="--lease"),
    )
    heartbeat: float | None = field(
        default=None,
        metadata=setting("seconds between lease renewals (None: a third of the lease)"),
    )
    window: float = field(
        default=0.02,
        metadata=setting(
            "base race window in seconds; 0 turns competition off",
            bounds=Bounds(0, 60),
            flag="--window",
        ),
    )
    jitter: float = field(
        default=0.1, metadata=setting("the race delay's random spread, a share of the delay")
    )
    grace: float = field(
        default=30.0,
        metadata=setting(
            "seconds running tasks get to finish on SIGTERM",
            bounds=Bounds(0, ONE_DAY),
            flag="--grace",
        ),
    )
    idle_wait: float = field(
        default=1.0,
        metadata=setting("longest sleep between change checks when nothing happens, seconds"),
    )
    fitness: Fitness = field(
        default=default_fitness,
        metadata=setting(
            "a custom fitness function (expert view, task view) -> [0, 1]",
            flag="--fitness",
            metavar="MODULE:FUNCTION",
            default_text="contend.domain.scoring:default_fitness",
        ),
    )
    zone_margin: float = field(
        default=0.0,
        metadata=setting(
            "extra race delay, seconds, for tasks that prefer tags (a zone) this expert lacks",
            bounds=Bounds(0, 60),
            flag="--zone-margin",
        ),
    )
    auction_window: float = field(
        default=0.2,
        metadata=setting(
            "how long an auction for a heavy task takes bids, seconds",
            bounds=Bounds(0, 60),
            flag="--auction-window",
        ),
    )
    auction_grace: float = field(
        default=auction.DEFAULT_GRACE,
        metadata=setting(
            "how long each bidder has to claim before the next may, seconds (the first "
            "bid on a task sets it for that auction)",
            bounds=Bounds(0, auction.MAX_GRACE, lo_open=True),
        ),
    )
    auction_threshold: float = field(
        default=2.0,
        metadata=setting(
            'mode="auto": auction the task types whose runs take this long, seconds',
            bounds=Bounds(0, ONE_DAY, lo_open=True),
        ),
    )
    prefetch: int = field(
        default=0,
        metadata=setting(
            "claim this many tasks ahead, unstarted; idle experts may steal them",
            bounds=Bounds(0, 10_000),
            flag="--prefetch",
        ),
    )
    claim_ahead: int | None = field(
        default=None,
        metadata=setting(
            "claim up to this many tasks beyond the free slots while runs end sooner than a "
            "claim takes (0: never)",
            bounds=Bounds(0, 10_000),
            flag="--claim-ahead",
            default_text="up to 1024 or the concurrency if more (the concurrency with fair task "
            "types), as run times warrant",
        ),
    )
    steal_ratio: float | None = field(  # None: never steal (--no-steal)
        default=1.0,
        metadata=setting(
            "steal unstarted tasks from experts at least this loaded, 1 = full",
            bounds=Bounds(0, 1, lo_open=True),
            flag="--steal-ratio",
        ),
    )
    pressure: PressurePolicy = field(
        default_factory=PressurePolicy,
        metadata=setting("when the cluster is under pressure, for emergency experts"),
    )
    gossip: tuple[str, ...] = field(
        default=(),
        metadata=setting(
            "learn rivals and their load by gossip from these seeds (any member; the first "
            "lists itself) instead of reading every heartbeat from the store; claims, leases "
            "and fences stay in the store (needs the gossip extra)",
            flag="--gossip",
            metavar="HOST:PORT,…",
            default_text="off: rivals are read from the store",
        ),
    )
    gossip_bind: str = field(
        default="127.0.0.1:0",
        metadata=setting(
            "the address gossip binds (port 0: any free one); off loopback it needs the "
            "cluster's key in CONTEND_GOSSIP_KEY",
            flag="--gossip-bind",
            metavar="HOST:PORT",
        ),
    )
    gossip_timing: str = field(
        default="lan",
        metadata=setting(
            "failure detection: lan (a dead expert is known in about 5 s), wan (slower, for "
            "lossy links) or fast (about 1 s, for one host or one switch)",
            choices=GOSSIP_TIMINGS,
            flag="--gossip-timing",
        ),
    )
    gossip_keys: tuple[str, ...] = field(
        default=(),
        repr=False,
        metadata=setting(
            "the gossip cluster's keys, base64, the first one encrypting (empty: read "
            "CONTEND_GOSSIP_KEY, comma-separated)"
        ),
    )

    def validate(self) -> None:
        """Raise ConfigError naming the first setting out of its bounds or choices."""
        hints = field_types()
        for f in fields(self):
            _check(f.name, getattr(self, f.name), hints[f.name], setting_of(f))
        try:
            check_retention(self.retention)
        except ConfigError as exc:
            raise ConfigError(f"retention: {exc}") from None
        hb = self.heartbeat_every
        if not 0 < hb < self.lease_ttl:
            raise ConfigError(f"heartbeat ({hb}) must be positive and shorter than the lease")
        for name, names in (("queues", self.queues), ("specialties", self.specialties)):
            if isinstance(names, str):
                raise ConfigError(f"{name} must be a list of names, got {shown(names)}")
        try:
            for queue in self.queues or ():
                check_queue(queue)  # the rule every submission is held to
            for specialty in self.specialties:
                check_name(specialty, "a specialty (a task type)")
            if self.name is not None:
                check_name(self.name, "an expert name")
        except TaskError as exc:
            raise ConfigError(str(exc)) from None
        check_seeds(self.gossip, "gossip")
        parse_hostport(self.gossip_bind, "gossip_bind", bind=True)
        if isinstance(self.gossip_keys, str) or not all(
            isinstance(k, str) and k for k in self.gossip_keys
        ):
            raise ConfigError("gossip_keys must be a list of base64 keys")

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease_ttl / 3


@functools.cache
def field_types() -> dict[str, Any]:
    """ExpertConfig's field types, resolved (the module's annotations are strings)."""
    return typing.get_type_hints(ExpertConfig)


def value_type(hint: Any) -> Any:
    """The type a field holds when it is set: ``float`` for ``float | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return kind
    return hint


def _check(name: str, value: Any, hint: Any, s: Setting) -> None:
    if value is None and value_type(hint) is not hint:
        return  # None is allowed, and means what the field's help says
    kind = value_type(hint)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name} must be an integer, got {shown(value)}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ConfigError(f"{name} must be a number, got {shown(value)}")
    if s.bounds is not None and value not in s.bounds:
        raise ConfigError(f"{name} must be {s.bounds}, got {value}")
    if s.choices and value not in s.choices:
        *most, last = s.choices
        raise ConfigError(f"{name} must be {', '.join(most)} or {last}, got {shown(value)}")
