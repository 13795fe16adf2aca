"""The expert's session in the store and the keeper that keeps its lease alive.

A :class:`Session` is one registration: a session id and a lease. Its deadline is reckoned on
this host's monotonic clock, as a duration: the moment the last successful renewal was *sent*
plus the lease, less a margin for the rate at which two hosts' clocks may drift apart
(:data:`RATE_MARGIN`). The store set its own deadline when the renewal *arrived*, a lease after
its own now, so that one is never earlier — no two hosts' clocks are ever compared.

Every store call made under a session goes through :meth:`Session.call`: it is not sent once
the deadline has passed, and one that does not answer by the deadline counts as failed, however
long the store goes on with it (a frozen connection, a held lock, a server that is down and a
driver that retries). A session is *lost* once, for good (``session.lost`` is set, as etcd's
``Session.Done()`` is closed): when the store says so (:class:`~contend.errors.LeaseLost`), or
when the keeper's **watchdog** sees the deadline pass without a renewal. Everything claimed
under a session depends on it: when it is lost, the keeper calls ``on_lost`` at once, and the
expert stops every run and drops every unsent outcome of it.

The :class:`LeaseKeeper` registers, renews on a fixed cadence (one call keeps every held task's
lease alive and publishes the expert's heartbeat), runs the watchdog, and, alone, opens a new
session after a loss: first it releases the lost one (so that a store that never noticed the
loss does not hold the name against the expert itself), then registers, retrying with capped
exponential back-off while the store is unreachable. Stopping renewal (:meth:`LeaseKeeper.orphan`:
the lease then runs out on its own) and releasing (:meth:`LeaseKeeper.close`: deregister, so
others may take over at once) are two different acts.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from contend.errors import ContendError, LeaseLost, SchemaError, StoreError
from contend.runtime.clock import Clock, bounded, wait_event
from contend.runtime.hooks import Hook
from contend.store.port import ExpertInfo, Heartbeat, Store

T = TypeVar("T")

log = logging.getLogger("contend.expert")

#: The share of a lease given up against clock-rate differences: the store's clock may run this
#: much faster than this host's without the store's deadline passing before the expert's.
#: NTP keeps a host within 0.05 %; 2 % leaves room for a badly kept virtual machine.
RATE_MARGIN = 0.02
#: A registration answered with less than this share of its lease left is renewed at once,
#: before the session is used (LeaseKeeper._renew_late).
LATE_REGISTRATION = 0.5
#: Opening a new session after a loss: the longest pause between two tries, seconds.
REOPEN_CAP = 10.0
#: For this long after a loss, seconds, the tries come at most QUICK_PAUSE apart (a store
#: restarting, a failover, a short cut) before the pause doubles up to REOPEN_CAP: with the
#: doubling alone, the new session came up to 10 s after the store was back, and the tasks of
#: every expert that lost its session waited that long on top of the outage.
QUICK_REOPEN = 30.0
QUICK_PAUSE = 1.0
#: While the tries are quick, a failed one is logged at most this often, seconds.
QUICK_LOG_EVERY = 10.0
#: Seconds to each of a session's first renewals, when the heartbeat is slower (see _interval).
EARLY_BEATS = (1.0, 1.0)


@dataclass(eq=False)
class Session:
    """One registration of the expert: its id in the store and its lease."""

    id: str
    ttl: float
    clock: Clock
    renewed_at: float  # clock.monotonic() when the last successful renewal was sent
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str | None = None  # why it was lost
    #: Called once when the session is lost: the gates of the store calls in flight under it
    #: (a callback each costs less than a task waiting on ``lost`` for every call).
    on_lost: set[Callable[[], None]] = field(default_factory=set, repr=False)

    def mark_lost(self, reason: str) -> None:
        self.reason = reason
        self.lost.set()
        for callback in list(self.on_lost):
            callback()
        self.on_lost.clear()

    @property
    def deadline(self) -> float:
        """The moment (this host's monotonic clock) after which the session may act no more."""
        return self.renewed_at + self.ttl * (1 - RATE_MARGIN)

    def left(self) -> float:
        """Seconds of lease left by this host's reckoning (≤ 0: lapsed)."""
        return self.deadline - self.clock.monotonic()

    def safe(self) -> bool:
        """True while this session may still act: not lost and within its deadline."""
        return not self.lost.is_set() and self.left() > 0

    async def done(self) -> None:
        """Return once the session is lost."""
        await self.lost.wait()

    async def call(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        """Make a store call under this session: ``make()`` is sent only while the session is
        safe, and its answer counts only if it comes before the deadline and the session is
        not lost meanwhile. Raises :class:`~contend.errors.LeaseLost` otherwise."""
        if not self.safe():
            why = self.reason or "no renewal within the lease"
            raise LeaseLost(f"{what} not sent: the lease is not safe ({why})")
        try:
            return await bounded(self.clock, make(), self.left(), unless=self.on_lost)
        except TimeoutError:
            if self.lost.is_set():
                raise LeaseLost(f"the lease was lost ({self.reason}) during {what}") from None
            raise LeaseLost(f"no answer to {what} before the lease ran out") from None


class LeaseKeeper:
    """Keeps one expert's lease: registers, renews every *every* seconds, watches the deadline,
    declares loss and opens a new session after one."""

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
        on_renewed: Callable[[Session, Mapping[str, int], float], None],
        on_lost: Callable[[Session], None],
        on_fatal: Callable[[ContendError], None] = lambda exc: None,
        rand: Callable[[], float] = random.random,
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
        self._on_fatal = on_fatal
        self._rand = rand
        self.session: Session | None = None
        self.ready = asyncio.Event()  # set while a session is open and not lost
        self.fatal: ContendError | None = None  # why the keeper gave up for good
        self._reopen = True
        self._tasks: list[asyncio.Task[None]] = []
        self._beats = 0

    @property
    def name(self) -> str:
        return self.info.id

    # -- the session -----------------------------------------------------------------------
    async def open(self) -> Session:
        """Register a new session; raises ExpertConflict when this name is live elsewhere, and
        StoreError when the store does not answer within a lease (a session granted later than
        that would be born lapsed)."""
        sent = self.clock.monotonic()
        within = self.ttl * (1 - RATE_MARGIN)
        try:
            sid = await bounded(self.clock, self.store.register_expert(self.info, self.ttl), within)
        except TimeoutError:
            raise StoreError(
                f"the store did not answer a registration within {within:g}s"
            ) from None
        session = Session(sid, self.ttl, self.clock, sent)
        if session.left() < self.ttl * LATE_REGISTRATION:
            await self._renew_late(session)
        self.session = session
        self.ready.set()
        return session

    async def _renew_late(self, session: Session) -> None:
        """Renew a session whose registration was answered late, before anything acts under
        it. Its lease counts from when the registration was sent: after a PostgreSQL restart
        one was answered with 60 ms of a 2 s lease left, the expert claimed 8 tasks under it,
        and the watchdog stopped them all 60 ms later. A renewal sent now counts from now. If
        it fails, the session is released and the registration counts as failed (a store that
        lost its schema raises its SchemaError)."""
        sent = self.clock.monotonic()
        try:
            await session.call(
                "the renewal of a late registration",
                lambda: self.store.renew(self.name, session.id, self.ttl, self._beat()),
            )
        except SchemaError:
            raise  # the store is gone for good: the keeper gives up, as on any call
        except ContendError as exc:
            session.mark_lost(str(exc))
            await self._release_quietly(session)
            raise StoreError(
                f"the store answered a registration late, and not the renewal after it: {exc}"
            ) from exc
        session.renewed_at = sent

    def lose(self, session: Session, reason: str) -> bool:
        """Declare *session* lost (once; later calls, from any part, change nothing) and stop
        everything that depends on it at once. Returns whether this call lost it."""
        if session.lost.is_set():
            return False
        session.mark_lost(reason)
        if session is self.session:
            self.ready.clear()
        self._on_lost(session)
        return True

    def wind_down(self) -> None:
        """The expert is stopping: keep renewing this session, but open no new one."""
        self._reopen = False

    def _give_up(self, exc: ContendError) -> None:
        """The store cannot be used any more (it lost its schema): stop for good."""
        log.error("expert %s: %s; stopping", self.name, exc)
        self.fatal = exc
        self._reopen = False
        if self.session is not None:
            self.lose(self.session, str(exc))
        self._on_fatal(exc)

    # -- renewing and watching -------------------------------------------------------------
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._renewing(), name=f"contend-lease-{self.name}"),
            asyncio.create_task(self._watching(), name=f"contend-watchdog-{self.name}"),
        ]

    async def _renewing(self) -> None:
        sent = self.clock.monotonic()
        while True:
            session = self.session
            assert session is not None
            if session.lost.is_set():
                if not self._reopen:
                    return  # nothing left to renew
                await self._open_again(session)
                sent = self.clock.monotonic()
                continue
            # on a fixed cadence, whatever the last renewal cost; at once when lost meanwhile
            wait = sent + self._interval() - self.clock.monotonic()
            if wait > 0 and await wait_event(self.clock, session.lost, wait):
                continue
            sent = self.clock.monotonic()
            await self._renew(session, sent)

    def _interval(self) -> float:
        """Seconds from one renewal to the next: the first ones come sooner (EARLY_BEATS), so
        that a newcomer's rivals learn its load and round trip, and it learns theirs, within
        a few seconds instead of a few heartbeats (races among experts that do not know each
        other's round trips lost up to a third of their claims in their first seconds)."""
        n, self._beats = self._beats, self._beats + 1
        return min(self.every, EARLY_BEATS[n]) if n < len(EARLY_BEATS) else self.every

    async def _watching(self) -> None:
        """The watchdog: at the session's deadline, if no renewal moved it, the session is
        lost — whatever the renewal in flight, or the store, is doing."""
        while True:
            session = self.session
            assert session is not None
            if session.lost.is_set():
                if not self._reopen:
                    return
                await self.ready.wait()  # the next session
                continue
            if await wait_event(self.clock, session.lost, max(0.0, session.left())):
                continue
            if session.left() <= 0:
                self.lose(session, "no renewal within the lease")

    async def _renew(self, session: Session, sent: float) -> None:
        beat = self._beat()
        try:
            held = await session.call(
                "a renewal", lambda: self.store.renew(self.name, session.id, self.ttl, beat)
            )
        except LeaseLost as exc:
            self.lose(session, str(exc))
            return
        except SchemaError as exc:
            self._give_up(exc)
            return
        except ContendError as exc:
            log.warning("expert %s: renewal failed, will retry: %s", self.name, exc)
            return
        answered = self.clock.monotonic()
        margin = session.deadline - answered  # the lease this renewal extended, still left
        session.renewed_at = sent
        log.debug("expert %s renewed its lease; the store says it holds %d", self.name, len(held))
        self.hooks.on_heartbeat(self.name, beat, len(held))
        self.hooks.on_renewal(self.name, answered - sent, margin)
        self._on_renewed(session, held, sent)

    async def _open_again(self, lost: Session) -> None:
        """After a loss: release the lost session, then register a new one, retrying until one
        opens: at most QUICK_PAUSE apart for QUICK_REOPEN, then with exponential back-off
        capped at REOPEN_CAP (with jitter)."""
        released = False
        pause = 0.0
        tries = slow = 0
        lost_at = logged_at = self.clock.monotonic()
        while self._reopen:
            if pause > 0:
                await self.clock.sleep(pause)
                if not self._reopen:
                    return
            tries += 1
            if not released:
                released = await self._release_quietly(lost)
            try:
                await self.open()
            except SchemaError as exc:
                self._give_up(exc)
                return
            except ContendError as exc:
                now = self.clock.monotonic()
                quick = now - lost_at < QUICK_REOPEN
                if quick:
                    step = min(self.every, QUICK_PAUSE)
                else:
                    slow += 1
                    step = min(REOPEN_CAP, self.every * 2 ** min(slow - 1, 30))
                pause = step * (0.5 + 0.5 * self._rand())
                if tries == 1 or not quick or now - logged_at >= QUICK_LOG_EVERY:
                    logged_at = now
                    log.log(
                        logging.ERROR if tries == 1 else logging.WARNING,
                        "expert %s: could not register a new session (try %d; next in %.1fs): %s",
                        self.name,
                        tries,
                        pause,
                        exc,
                    )
            else:
                log.info("expert %s: new session registered (try %d)", self.name, tries)
                return

    async def _release_quietly(self, session: Session) -> bool:
        """Release a lost session before registering anew: in a store that never noticed the
        loss, it would hold the name against the expert itself. Returns whether it was done;
        a failure only means the next registration may meet that session."""
        try:
            await self._release(session)
        except ContendError as exc:
            log.debug("expert %s: could not release the lost session: %s", self.name, exc)
            return False
        return True

    async def _release(self, session: Session) -> None:
        """Deregister *session* (a no-op in a store that ended it already); bounded."""
        try:
            await bounded(
                self.clock, self.store.deregister_expert(self.name, session.id), self.every
            )
        except TimeoutError:
            raise StoreError(
                f"the store did not answer a deregistration within {self.every:g}s"
            ) from None

    # -- stopping --------------------------------------------------------------------------
    async def orphan(self) -> None:
        """Stop renewing (and watching); the lease then lapses on its own in the store."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, Exception):
                log.error("expert %s: the lease keeper crashed: %r", self.name, result)

    async def close(self) -> None:
        """Stop renewing and release the session (deregister), so that what it held can be
        taken over at once."""
        await self.orphan()
        session = self.session
        if session is None or self.fatal is not None:
            return  # a store that lost its schema is not written to
        if not session.lost.is_set() and session.safe():
            # one last heartbeat: the counters the store keeps are the final ones, not those of
            # the last renewal (status and the demo show them)
            beat = self._beat()
            try:
                await session.call(
                    "a last heartbeat",
                    lambda: self.store.renew(self.name, session.id, self.ttl, beat),
                )
            except ContendError as exc:
                log.debug("expert %s: the last heartbeat failed: %s", self.name, exc)
        try:
            await self._release(session)
        except ContendError as exc:
            log.warning("expert %s: could not deregister: %s", self.name, exc)
