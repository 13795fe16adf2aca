"""One expert's membership of the gossip cluster: SWIM by kinship, and contend's load map.

kinship (an optional extra: ``pip install 'contend[gossip]'``) detects failures. It uses SWIM
with indirect probes, suspicion and the Lifeguard extensions, and runs on a thread of its own,
so a busy event loop here does not get this expert declared dead. Each member's metadata
carries its summary (``contend.gossip.payload``) and the summary's version. This module:

* publishes the expert's summary when it changes. It publishes at most once per
  :meth:`GossipNode.gap` seconds (``min_gap``, or longer in a cluster too large for every
  member to publish that often within kinship's gossip budget), and republishes when the protocol says this member had to refute a
  suspicion or a death, or ``refresh`` seconds after the last publish. A rival that buried
  it in between sees a version higher than the tombstone, and takes it back;
* merges what it hears into its :class:`~contend.domain.loadmap.LoadMap` (stamp: the member's
  run epoch and the summary version), and lays a tombstone when a member dies or leaves;
* hands the housekeeper the rivals as :class:`~contend.store.port.ExpertRecord` values, the same
  shape the store's ``list_experts`` gives, so competition does not know where they came from.

Gossip only informs. Claims, leases and fences stay in the store, and an expert's lease is
still renewed there, gossip or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contend.domain.hostport import is_loopback, parse_hostport
from contend.domain.loadmap import Entry, LoadMap, canonical
from contend.errors import ConfigError, MissingExtraError
from contend.gossip.payload import record
from contend.store.port import ExpertRecord

if TYPE_CHECKING:
    import kinship

log = logging.getLogger("contend.gossip")

#: Failure-detection timings by name. ``lan`` and ``wan`` are kinship's presets; ``fast``
#: probes five times as often (tests, one host, a rack on one switch).
TIMINGS = ("lan", "wan", "fast")
_FAST = {
    "probe_interval": 0.2,
    "probe_timeout": 0.1,
    "suspicion_mult": 3,
    "gossip_interval": 0.2,
    # a healed partition is found by reconnecting to the members it made dead, and the two
    # sides' load maps then merge by push-pull: every 2 s and 5 s here, 30 s on lan
    "reconnect_interval": 2.0,
    "push_pull_interval": 5.0,
}
#: Summaries a second the whole cluster may publish. kinship gossips to 3 members every
#: 200 ms, one datagram of at most 1,400 bytes each: about 17 summaries a second across the
#: cluster (docs/gossip.md); past that, rumours queue and every view lags. So each member
#: spaces its publishes to keep the cluster below this, with room for probes and refutations:
#: every 5 s (a heartbeat) up to 60 members, every 83 s at 1,000.
CLUSTER_RATE = 12.0
#: kinship's limit on one member's metadata, bytes (keys and framing included).
MAX_META_BYTES = 1024
#: Longest member name kinship takes, in UTF-8 bytes.
MAX_NAME_BYTES = 64
#: The cluster label: members with another label ignore this cluster's packets.
CLUSTER = "contend"


def member_name(expert: str) -> str:
    """The gossip name of an expert: its own name when it fits kinship's 64 bytes, else a
    prefix of it and a hash (the summary still carries the full name)."""
    if len(expert.encode()) <= MAX_NAME_BYTES:
        return expert
    digest = hashlib.sha256(expert.encode()).hexdigest()[:16]
    head = expert.encode()[: MAX_NAME_BYTES - 17].decode(errors="ignore")
    return f"{head}~{digest}"


def _kinship() -> Any:
    try:
        import kinship
    except ImportError as exc:
        raise MissingExtraError("gossip (--gossip)", "gossip", "kinship") from exc
    return kinship


class GossipNode:
    """The gossip side of one expert. ``await start()``, then :meth:`publish` the summary
    at each heartbeat and read :meth:`records`; ``await close()`` leaves the cluster."""

    def __init__(
        self,
        name: str,
        *,
        bind: str = "127.0.0.1:0",
        seeds: Sequence[str] = (),
        keys: Sequence[str] = (),
        timing: str = "lan",
        min_gap: float = 0.2,
        refresh: float = 30.0,
        tombstone_ttl: float = 120.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if timing not in TIMINGS:
            raise ConfigError(f"gossip timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
        host, _ = parse_hostport(bind, "gossip_bind", bind=True)
        if not keys and not is_loopback(host):
            raise ConfigError(
                f"gossip binds {bind}, off loopback: give the cluster's key in "
                "CONTEND_GOSSIP_KEY (make one with `python -m kinship keygen`); "
                "without a key gossip runs only on 127.0.0.1"
            )
        self.expert = name
        self.name = member_name(name)
        self.bind = bind
        self.seeds = list(seeds)
        self._keys = list(keys)
        self.timing = timing
        self.min_gap = min_gap
        self.refresh = refresh
        self.tombstone_ttl = tombstone_ttl
        self._monotonic = monotonic
        self._wall = wall
        self.map = LoadMap()
        self._heard: dict[str, float] = {}  # member -> wall time its register last changed
        self._started: dict[str, float] = {}  # member -> its run's start (epoch), seconds
        self._cluster: kinship.Cluster | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wanted: dict[str, Any] | None = None
        self._sent: str | None = None
        self._version = 0
        self._changed = asyncio.Event()
        self._records: list[ExpertRecord] | None = None  # rebuilt when the map changes
        self.failed: BaseException | None = None
        #: Called with (what, member) at each membership event: joined, updated, suspect,
        #: recovered, dead, left; and "published" when this member's summary went out
        #: (tests and the benchmark listen here).
        self.on_event: Callable[[str, str], None] | None = None
        self.published = 0  # summaries sent, for tests and the benchmark

    # -- life ------------------------------------------------------------------------------
    def _config(self) -> Any:
        k = _kinship()
        preset = k.Config.wan if self.timing == "wan" else k.Config.lan
        fields: dict[str, Any] = {
            "name": self.name,
            "bind": self.bind,
            "seeds": self.seeds,
            "cluster": CLUSTER,
            "max_meta_bytes": MAX_META_BYTES,
        }
        if self.timing == "fast":
            fields.update(_FAST)
        if self._keys:
            fields["keys"] = self._keys
        else:
            fields["insecure_plaintext"] = True  # loopback only: checked in __init__
        try:
            return preset(**fields)
        except ValueError as exc:  # kinship.ConfigError names the field
            raise ConfigError(f"gossip: {exc}") from exc

    async def start(self) -> None:
        k = _kinship()
        cfg = self._config()
        k.log_to_python()  # kinship's own log lines go to the "kinship" logger
        cluster = k.Cluster(cfg)
        try:
            await cluster.start()
        except k.KinshipError as exc:
            raise ConfigError(f"gossip could not start on {self.bind}: {exc}") from exc
        self._cluster = cluster
        events = cluster.events()  # subscribe before reading the snapshot: nothing is missed
        self._resync()
        self._tasks = [
            asyncio.create_task(self._listen(events), name="contend-gossip-listen"),
            asyncio.create_task(self._publish_loop(), name="contend-gossip-publish"),
        ]
        log.info(
            "gossip: %s joined as %s at %s (seeds: %s)",
            self.expert,
            self.name,
            self.address,
            ",".join(self.seeds) or "none",
        )

    async def close(self, leave: float = 1.0) -> None:
        """Leave (peers see it at once, not after a suspicion), then stop."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            with contextlib.suppress(Exception):
                await cluster.leave(timeout=leave)
            with contextlib.suppress(Exception):
                await cluster.close()

    @property
    def running(self) -> bool:
        return self._cluster is not None and self.failed is None

    @property
    def address(self) -> str:
        return str(self._cluster.local.addr) if self._cluster is not None else self.bind

    def stats(self) -> Mapping[str, int]:
        if self._cluster is None:
            return {}
        s = self._cluster.stats()
        return {f.name: int(getattr(s, f.name)) for f in dataclasses.fields(s)}

    # -- publishing ------------------------------------------------------------------------
    def gap(self) -> float:
        """The least time between two publishes of this member: ``min_gap``, or as long as
        keeps the cluster's live members together at :data:`CLUSTER_RATE` summaries a
        second (a refutation goes out at once all the same)."""
        return max(self.min_gap, max(1, len(self.map.live())) / CLUSTER_RATE)

    def publish(self, state: Mapping[str, Any]) -> None:
        """Offer this expert's summary; the publisher sends it if it changed."""
        self._wanted = dict(state)
        if canonical(self._wanted) != self._sent:
            self._changed.set()

    async def _publish_loop(self) -> None:
        assert self._cluster is not None
        cluster = self._cluster
        last = -self.min_gap
        refutations = 0
        try:
            while True:
                due = last + self.refresh - self._monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), max(0.0, min(1.0, due)))
                refuted = cluster.stats().refutations
                wanted = self._wanted
                if wanted is None:
                    continue
                text = canonical(wanted)
                stale = self._monotonic() - last >= self.refresh
                if text == self._sent and refuted == refutations and not stale:
                    self._changed.clear()
                    continue
                wait = last + self.gap() - self._monotonic()
                if wait > 0 and refuted == refutations:
                    # a rate limit: the latest summary goes then (looking again each second
                    # for a refutation, which goes at once)
                    await asyncio.sleep(min(wait, 1.0))
                    continue
                self._changed.clear()
                refutations = refuted
                self._version += 1
                await cluster.set_meta({"s": text, "v": str(self._version)})
                self._sent, last = text, self._monotonic()
                self.published += 1
                me = cluster.local
                self._take(me.name, me.epoch, me.meta)
                if self.on_event is not None:
                    self.on_event("published", me.name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            log.warning("gossip: publishing stopped: %r; rivals are read from the store", exc)

    # -- listening -------------------------------------------------------------------------
    def _entry(self, epoch: int, meta: Mapping[str, str]) -> Entry | None:
        text, version = meta.get("s"), meta.get("v", "")
        if text is None or not version.isdigit() or len(text) > MAX_META_BYTES:
            return None
        try:
            state = json.loads(text)
        except ValueError:
            return None
        if not isinstance(state, dict):
            return None
        return Entry(epoch, int(version), canonical(state))

    def _take(self, name: str, epoch: int, meta: Mapping[str, str]) -> None:
        new = self._entry(epoch, meta)
        if new is not None and self.map.put(name, new, self._monotonic()):
            self._heard[name] = self._wall()
            self._started[name] = epoch / 1000
            self._records = None

    def _bury(self, name: str, epoch: int, meta: Mapping[str, str]) -> None:
        if self.map.bury(name, self._monotonic(), upto=self._entry(epoch, meta)):
            self._records = None

    def _resync(self) -> None:
        """Take the protocol's snapshot of the live members; bury those it no longer has
        (their death was among the events lost)."""
        assert self._cluster is not None
        members = self._cluster.members()
        for m in members:
            self._take(m.name, m.epoch, m.meta)
        present = {m.name for m in members}
        for name in [n for n in self.map.live() if n not in present]:
            if self.map.bury(name, self._monotonic()):
                self._records = None

    async def _listen(self, events: Any) -> None:
        k = _kinship()
        kinds = {
            k.MemberJoined: "joined",
            k.MemberUpdated: "updated",
            k.MemberRecovered: "recovered",
            k.MemberSuspect: "suspect",
            k.MemberDead: "dead",
            k.MemberLeft: "left",
        }
        try:
            async for ev in events:
                kind = kinds.get(type(ev))
                if kind in ("joined", "updated", "recovered"):
                    self._take(ev.member.name, ev.member.epoch, ev.member.meta)
                elif kind in ("dead", "left"):
                    self._bury(ev.member.name, ev.member.epoch, ev.member.meta)
                elif isinstance(ev, k.EventsLost):
                    log.info("gossip: %d events lost; reading the members again", ev.count)
                    self._resync()
                if kind is not None:
                    if kind != "updated":
                        log.debug("gossip: %s %s", ev.member.name, kind)
                    if self.on_event is not None:
                        self.on_event(kind, ev.member.name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            log.warning("gossip: listening stopped: %r; rivals are read from the store", exc)

    # -- reading ---------------------------------------------------------------------------
    def records(self) -> list[ExpertRecord] | None:
        """Every live member (this expert included) as the store would list it; None while
        gossip is not running, so the caller reads the store instead."""
        if not self.running:
            return None
        forgotten = self.map.forget(self._monotonic() - self.tombstone_ttl)
        for name in forgotten:
            self._heard.pop(name, None)
            self._started.pop(name, None)
        if self._records is None:
            out = []
            for name, e in self.map.live().items():
                rec = record(
                    e, heard_at=self._heard.get(name, 0.0), started_at=self._started.get(name, 0.0)
                )
                if rec is not None:
                    out.append(rec)
            self._records = out
        return list(self._records)
