"""Housekeeping, after each renewal but apart from it: slow housekeeping on a big store never
delays a renewal. It expires lapsed leases (anyone's), refreshes the expert's view of its rivals
and of the cluster's pressure, and releases claims the store says this expert holds but the
expert does not know of (a claim whose reply was lost). Each of its store calls is made under
the session it followed, so none outlives that session's deadline."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping

from contend.domain.retention import DEFAULT_BATCH, DEFAULT_KEEP_EVENTS
from contend.errors import ContendError, LeaseLost
from contend.runtime.competition import Competition
from contend.runtime.hooks import Hook
from contend.runtime.session import Session
from contend.store.port import ExpertRecord, Store

log = logging.getLogger("contend.expert")

#: Seconds between two rounds of retention passes of one expert, once it has caught up; at
#: most a quarter of the retention, so a store holds at most 1.25 retentions' worth of tasks
#: (a 20 s retention at 10,000 tasks/s held 720,000 rows between rounds 30 s apart).
PRUNE_EVERY = 30.0
#: The share of the time since its last round that one round of passes may take (one round
#: per heartbeat while behind), and the most it may take.
PRUNE_SHARE = 0.2
PRUNE_SHARE_MOST = 0.5
PRUNE_MOST = 2.5


class Orphans:
    """Tasks held in the store but unknown to the expert. One heartbeat of grace (the reply
    of a claim may be on its way), then they are to be released."""

    def __init__(self) -> None:
        self._unknown: set[str] = set()

    def note(self, held: Mapping[str, int], known: set[str]) -> list[tuple[str, int]]:
        """Take in one renewal's view; returns (id, fence) of the tasks unknown twice running."""
        unknown = {tid for tid in held if tid not in known}
        orphans = [(tid, held[tid]) for tid in sorted(unknown & self._unknown)]
        self._unknown = unknown - {tid for tid, _ in orphans}
        return orphans


class Housekeeper:
    def __init__(
        self,
        store: Store,
        name: str,
        queues: list[str],
        *,
        competition: Competition,
        load: Callable[[], int],
        on_join_or_leave: Callable[[], None],
        hooks: Hook | None = None,
        retention: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        peers: Callable[[], list[ExpertRecord] | None] | None = None,
    ) -> None:
        self.store = store
        #: Where rivals come from when not from the store (gossip); None from it: the store.
        self._peers = peers
        self.name = name
        self.queues = queues
        self.competition = competition
        self._load = load
        self._on_change = on_join_or_leave
        self.hooks = hooks or Hook()
        self.orphans = Orphans()
        self._due = asyncio.Event()
        self._session: Session | None = None  # the session of the last renewal
        self._release: list[tuple[Session, list[tuple[str, int]]]] = []
        #: Finished tasks older than this (seconds) are pruned, one bounded pass a minute
        #: (``contend.domain.retention``); None keeps them.
        self.retention = retention
        self._monotonic = monotonic
        self._next_prune = monotonic()
        self._last_prune = monotonic()
        self._prune_share = PRUNE_SHARE

    def after_renewal(self, session: Session, held: Mapping[str, int], known: set[str]) -> None:
        """Called by the heartbeat with what the store says this expert holds."""
        orphans = self.orphans.note(held, known)
        if orphans:
            self._release.append((session, orphans))
        self._session = session
        self._due.set()

    async def run(self) -> None:
        while True:
            await self._due.wait()
            self._due.clear()
            session = self._session
            if session is None:
                continue
            try:
                await self._release_orphans()
                expired = await session.call("an expiry", self.store.expire)
                if expired:
                    self.hooks.on_expired(self.name, expired)
                await self.refresh_cluster(session)
                await self._prune(session)
            except LeaseLost as exc:
                log.debug("expert %s: housekeeping stopped: %s", self.name, exc)
            except ContendError as exc:
                log.warning("expert %s: housekeeping failed: %s", self.name, exc)

    async def _prune(self, session: Session) -> None:
        """Retention, when a round is due: passes of a bounded batch (each holds the store's
        locks briefly) for up to PRUNE_SHARE of the time since the last round. Caught up (a
        pass found less than a batch), the next round is due in PRUNE_EVERY; behind, at the
        next heartbeat, so that a busy store is pruned about as fast as it fills. A short
        retention shortens the wait: at most a quarter of it."""
        age = self.retention
        clock = self._monotonic
        if age is None or clock() < self._next_prune:
            return
        before = await session.call("a read", self.store.now) - age
        began, pruned, passes, n = clock(), 0, 0, DEFAULT_BATCH
        budget = min(PRUNE_MOST, self._prune_share * (began - self._last_prune))
        self._last_prune = began
        while n == DEFAULT_BATCH and clock() - began <= budget:
            n = await session.call(
                "a prune",
                lambda: self.store.prune(before, DEFAULT_BATCH, keep_events=DEFAULT_KEEP_EVENTS),
            )
            pruned += n
            passes += 1
        behind = n == DEFAULT_BATCH
        self._next_prune = clock() + (0.0 if behind else min(PRUNE_EVERY, age / 4))
        # behind: a larger share of the time at each round, up to PRUNE_SHARE_MOST
        self._prune_share = (
            min(PRUNE_SHARE_MOST, self._prune_share * 1.5) if behind else PRUNE_SHARE
        )
        if pruned:
            log.info(
                "expert %s: pruned %d finished task(s) in %d pass(es), %.2fs%s",
                self.name,
                pruned,
                passes,
                clock() - began,
                "; more are due" if behind else "",
            )

    async def refresh_cluster(self, session: Session) -> None:
        """Rivals, cluster load and, for an emergency expert, whether to join in. Rivals come
        from gossip while it runs, else from the store's list of experts."""
        comp = self.competition
        peers = self._peers() if self._peers is not None else None
        if peers is None:
            peers = await session.call("a read", self.store.list_experts)
        comp.update_peers(peers, self._load())
        if comp.tier == "emergency":
            was = comp.active
            backlog = await session.call("a read", lambda: self.store.backlog(self.queues))
            now = comp.update_pressure(backlog, self._load())
            if now != was:
                log.info(
                    "expert %s (emergency) %s",
                    self.name,
                    "joins: the cluster is under pressure" if now else "stands down",
                )
                self._on_change()

    async def _release_orphans(self) -> None:
        batches, self._release = self._release, []
        for session, orphans in batches:
            if not session.safe():
                continue
            try:
                release = functools.partial(self.store.release, self.name, orphans)
                results = await session.call("a release", release)
            except ContendError as exc:
                log.warning("expert %s: could not release orphaned claims: %s", self.name, exc)
                continue
            n = sum(1 for r in results if r is None)
            log.warning(
                "expert %s released %d task(s) it held in the store without knowing of them "
                "(a claim reply was lost)",
                self.name,
                n,
            )
