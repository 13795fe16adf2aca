"""The expert's session in the store and the keeper that keeps its lease alive.

A :class:`Session` is one registration: a session id and a lease. It is *lost* once, for good
(``session.lost`` is set, as etcd's ``Session.Done()`` is closed): when the store says so
(:class:`~contend.errors.LeaseLost`), or when a whole lease has passed without a successful
renewal, measured on this host's monotonic clock (a duration, never a comparison with another
host's clock). Everything claimed under a session depends on it: when it is lost, the keeper
calls ``on_lost`` at once, and the expert stops every run and drops every unsent outcome of it.

The :class:`LeaseKeeper` registers, renews on a fixed cadence (one call keeps every held task's
lease alive and publishes the expert's heartbeat), declares loss, and opens a new session after
one. Stopping renewal (:meth:`LeaseKeeper.orphan`: the lease then runs out on its own) and
releasing (:meth:`LeaseKeeper.close`: deregister, so others may take over at once) are two
different acts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from contend.errors import ContendError, LeaseLost
from contend.runtime.clock import Clock, wait_event
from contend.runtime.hooks import Hook
from contend.store.port import ExpertInfo, Heartbeat, Store

log = logging.getLogger("contend.expert")


@dataclass(eq=False)
class Session:
    """One registration of the expert: its id in the store and its lease."""

    id: str
    ttl: float
    clock: Clock
    renewed_at: float  # clock.monotonic() when the last successful renewal was sent
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None  # why it was lost

    def left(self) -> float:
        """Seconds of lease left by this host's reckoning (≤ 0: lapsed)."""
        return self.renewed_at + self.ttl - self.clock.monotonic()

    def safe(self) -> bool:
        """True while this session may still act: not lost and renewed within a lease."""
        return not self.lost.is_set() and self.left() > 0

    async def done(self) -> None:
        """Return once the session is lost."""
        await self.lost.wait()


class LeaseKeeper:
    """Keeps one expert's lease: registers, renews every *every* seconds, declares loss."""

    def __init__(
        self,
        store: Store,
        info: ExpertInfo,
        *,
        ttl: float,
        every: float,
        clock: Clock,
        hooks: Hook,
        beat: Callable[[], Heartbeat],
        on_renewed: Callable[[Session, Mapping[str, int]], None],
        on_lost: Callable[[Session], None],
    ) -> None:
        self.store = store
        self.info = info
        self.ttl = ttl
        self.every = every
        self.clock = clock
        self.hooks = hooks
        self._beat = beat
        self._on_renewed = on_renewed
        self._on_lost = on_lost
        self.session: Session | None = None
        self._reopen = True
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.info.id

    # -- the session -----------------------------------------------------------------------
    async def open(self) -> Session:
        """Register a new session; raises ExpertConflict when this name is live elsewhere."""
        sent = self.clock.monotonic()
        sid = await self.store.register_expert(self.info, self.ttl)
        self.session = Session(sid, self.ttl, self.clock, sent)
        return self.session

    def lose(self, session: Session, reason: str) -> bool:
        """Declare *session* lost (once; later calls, from any part, change nothing) and stop
        everything that depends on it at once. Returns whether this call lost it."""
        if session.lost.is_set():
            return False
        session.reason = reason
        session.lost.set()
        self._on_lost(session)
        return True

    def wind_down(self) -> None:
        """The expert is stopping: keep renewing this session, but open no new one."""
        self._reopen = False

    # -- renewing --------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"contend-lease-{self.name}")

    async def _run(self) -> None:
        sent = self.clock.monotonic()
        while True:
            session = self.session
            assert session is not None
            if session.lost.is_set():
                if not self._reopen:
                    return  # nothing left to renew
                await self._open_again()
                sent = self.clock.monotonic()
                continue
            # on a fixed cadence, whatever the last renewal cost; at once when lost meanwhile
            wait = sent + self.every - self.clock.monotonic()
            if wait > 0 and await wait_event(self.clock, session.lost, wait):
                continue
            if not session.safe():
                self.lose(session, "no renewal within the lease")
                continue
            sent = self.clock.monotonic()
            await self._renew(session, sent)

    async def _renew(self, session: Session, sent: float) -> None:
        beat = self._beat()
        try:
            held = await self.store.renew(self.name, session.id, self.ttl, beat)
        except LeaseLost as exc:
            self.lose(session, str(exc))
            return
        except ContendError as exc:
            log.warning("expert %s: renewal failed, will retry: %s", self.name, exc)
            return
        if session.lost.is_set():
            return  # lost while the renewal was on its way: it counts for nothing
        session.renewed_at = sent
        log.debug("expert %s renewed its lease; the store says it holds %d", self.name, len(held))
        self.hooks.on_heartbeat(self.name, beat, len(held))
        self._on_renewed(session, held)

    async def _open_again(self) -> None:
        """After a loss: register a new session, trying once a heartbeat until one opens."""
        while self._reopen:
            try:
                await self.open()
            except ContendError as exc:
                log.error("expert %s: could not register a new session: %s", self.name, exc)
                await self.clock.sleep(self.every)
            else:
                log.info("expert %s: new session registered", self.name)
                return

    # -- stopping --------------------------------------------------------------------------
    async def orphan(self) -> None:
        """Stop renewing; the lease then lapses on its own in the store."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        (result,) = await asyncio.gather(task, return_exceptions=True)
        if isinstance(result, Exception):
            log.error("expert %s: the lease keeper crashed: %r", self.name, result)

    async def close(self) -> None:
        """Stop renewing and release the session (deregister), so that what it held can be
        taken over at once."""
        await self.orphan()
        session = self.session
        if session is None:
            return
        try:
            await self.store.deregister_expert(self.name, session.id)
        except ContendError as exc:
            log.warning("expert %s: could not deregister: %s", self.name, exc)
