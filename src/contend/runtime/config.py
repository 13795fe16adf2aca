"""How an expert behaves: every setting, its default and its check, in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from contend.domain.scoring import Fitness, default_fitness
from contend.domain.task import Capabilities
from contend.errors import ConfigError
from contend.runtime.competition import PressurePolicy


@dataclass
class ExpertConfig:
    """How an expert behaves. Every field has a sensible default."""

    name: str | None = None
    concurrency: int = 8
    queues: Sequence[str] | None = None  # None: the queues of the app's task types
    capabilities: Capabilities = field(default_factory=Capabilities)
    tier: str = "general"
    specialties: frozenset[str] = frozenset()
    lease_ttl: float = 15.0
    heartbeat: float | None = None  # default lease_ttl / 3
    window: float = 0.02  # base race window, seconds
    jitter: float = 0.1
    grace: float = 30.0  # SIGTERM: how long running tasks may take to finish
    idle_wait: float = 1.0  # longest sleep between change checks when nothing happens
    fitness: Fitness = default_fitness
    zone_margin: float = 0.0  # extra race delay for a task that prefers tags this expert lacks
    auction_window: float = 0.2  # how long an auction takes bids, seconds
    auction_grace: float = 0.5  # how long each bidder has to claim before the next may
    auction_threshold: float = 2.0  # mode="auto": auction types whose runs take this long
    prefetch: int = 0  # tasks claimed ahead, unstarted, beyond the running ones
    steal_ratio: float | None = 1.0  # steal from experts this loaded (None: never steal)
    pressure: PressurePolicy = field(default_factory=PressurePolicy)

    def validate(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise ConfigError(f"concurrency must be an integer, got {self.concurrency!r}")
        if not 1 <= self.concurrency <= 10_000:
            raise ConfigError(f"concurrency must be between 1 and 10000, got {self.concurrency}")
        if not 0.5 <= self.lease_ttl <= 86_400:
            raise ConfigError(f"lease_ttl must be between 0.5 s and one day, got {self.lease_ttl}")
        hb = self.heartbeat_every
        if not 0 < hb < self.lease_ttl:
            raise ConfigError(f"heartbeat ({hb}) must be positive and shorter than the lease")
        if not 0 <= self.window <= 60:
            raise ConfigError(f"window must be between 0 and 60 s, got {self.window}")
        if self.tier not in ("general", "specialized", "emergency"):
            raise ConfigError(f"tier must be general, specialized or emergency, got {self.tier!r}")
        if not 0 <= self.auction_window <= 60 or not 0 < self.auction_grace <= 600:
            raise ConfigError("auction_window must be in [0, 60] s and auction_grace in (0, 600] s")
        if not 0 < self.auction_threshold <= 86_400:
            raise ConfigError(f"auction_threshold must be positive, got {self.auction_threshold}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int):
            raise ConfigError(f"prefetch must be an integer, got {self.prefetch!r}")
        if not 0 <= self.prefetch <= 10_000:
            raise ConfigError(f"prefetch must be between 0 and 10000, got {self.prefetch}")
        if self.steal_ratio is not None and not 0 < self.steal_ratio <= 1:
            raise ConfigError(f"steal_ratio must be in (0, 1], got {self.steal_ratio}")
        if not 0 <= self.zone_margin <= 60:
            raise ConfigError(f"zone_margin must be between 0 and 60 s, got {self.zone_margin}")
        if not 0 <= self.grace <= 86_400:
            raise ConfigError(f"grace must be between 0 and one day, got {self.grace}")
        if self.name is not None and (not self.name or len(self.name) > 200):
            raise ConfigError("an expert name must be 1 to 200 characters")

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.lease_ttl / 3
