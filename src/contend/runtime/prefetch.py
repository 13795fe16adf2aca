"""Prefetch and work stealing (seed 003): tasks an expert claimed without starting them, and
how an idle expert takes such tasks from a loaded rival.

A prefetched task is claimed in the store but not started, so a rival with a free slot may
steal it (``Store.steal``) until its holder starts it; the holder then learns at the start
(``Store.start`` answers why a task is no longer its own) or at its next renewal, which lists
the tasks the store still gives it.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Iterable, Iterator, Mapping

from contend.runtime.competition import Competition
from contend.runtime.config import ExpertConfig
from contend.runtime.hooks import Hook, task_fields
from contend.runtime.session import Session
from contend.store.port import Claimed, Store

log = logging.getLogger("contend.expert")


def still_held(
    c: Claimed, held: Mapping[str, int], claimed_at: Mapping[str, float], sent: float
) -> bool:
    """Whether a task claimed ahead is still this expert's by a renewal sent at *sent* that
    answered *held* (ids to fences): it is listed at its fence, or it was claimed after the
    renewal was sent (*claimed_at*: when each claim answered), so the answer may not list it."""
    return held.get(c.id) == c.fence or claimed_at.get(c.id, 0) >= sent


class Prefetch:
    """The tasks one expert claimed ahead and has not started, oldest first."""

    def __init__(self, store: Store, name: str, hooks: Hook) -> None:
        self.store = store
        self.name = name
        self.hooks = hooks
        self._tasks: deque[Claimed] = deque()
        self._at: dict[str, float] = {}  # task id -> when its claim answered (monotonic)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Claimed]:
        return iter(self._tasks)

    def add(self, claimed: Iterable[Claimed], now: float) -> None:
        for c in claimed:
            self._tasks.append(c)
            self._at[c.id] = now

    def take(self) -> list[Claimed]:
        """All of them, forgotten here (the expert is stopping or lost its session)."""
        out = list(self._tasks)
        self._tasks.clear()
        self._at.clear()
        return out

    def retain(self, held: Mapping[str, int], sent: float) -> None:
        """Forget the tasks the store no longer gives this expert (stolen), by a renewal sent
        at *sent*: *held* maps the ids it holds to their fences. One claimed after *sent* may
        not be in that answer yet, so it stays."""
        at = self._at
        kept = [c for c in self._tasks if still_held(c, held, at, sent)]
        if len(kept) != len(self._tasks):
            ids = {c.id for c in kept}
            self.hooks.on_taken_over(self.name, [c.id for c in self._tasks if c.id not in ids])
        self._tasks = deque(kept)
        self._at = {c.id: at[c.id] for c in kept if c.id in at}

    async def start(self, session: Session, free: int) -> list[Claimed]:
        """Start up to *free* of them in the store, oldest first; those a rival took
        meanwhile are reported to the hooks and dropped."""
        batch = [self._tasks.popleft() for _ in range(min(free, len(self._tasks)))]
        for c in batch:
            self._at.pop(c.id, None)
        items = [(c.id, c.fence) for c in batch]
        results = await session.call("a start", lambda: self.store.start(self.name, items))
        started, gone = [], []
        for c, res in zip(batch, results, strict=True):
            if res is None:
                started.append(c)
                continue
            gone.append(c.id)
            log.info(
                "expert %s: prefetched task %s (%s) attempt %d fence %d was taken over (%s)",
                self.name,
                c.id,
                c.type,
                c.attempt,
                c.fence,
                res,
                extra=task_fields(self.name, c),
            )
        if gone:
            self.hooks.on_taken_over(self.name, gone)
        return started

    async def steal(
        self,
        session: Session,
        config: ExpertConfig,
        competition: Competition,
        queues: list[str],
        types: tuple[str, ...],
        free: int,
    ) -> list[Claimed]:
        """Rivals' prefetched tasks for this expert's *free* slots: taken from the first
        rival loaded above the steal ratio that serves one of *queues* and holds some; none
        when stealing is off."""
        ratio = config.steal_ratio
        if ratio is None:
            return []
        victims = [
            p
            for p in competition.loaded
            if p.load / max(1, p.info.capacity) >= ratio
            and not set(queues).isdisjoint(p.info.queues)
        ]
        for victim in victims:
            take = functools.partial(
                self.store.steal,
                self.name,
                session.id,
                victim.info.id,
                queues,
                config.capabilities,
                limit=free,
                lease_ttl=config.lease_ttl,
                types=types,
            )
            got = await session.call("a steal", take)
            if got:
                self.hooks.on_stolen(self.name, victim.info.id, got)
                return got
        return []
