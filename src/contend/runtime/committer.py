"""The committer: finished runs' outcomes, grouped into fenced ``complete``/``fail`` calls.

Outcomes that arrive in the same turn of the event loop go to the store together: one
``complete`` for the results and one ``fail`` for the failures of a batch. Each outcome carries
the session it was earned under and is committed only while that session is safe; a session
that lapsed is declared lost (which drops every unsent outcome of it) and nothing of it is sent.
Every call is bounded by the session's deadline (``Session.call``): one that gets no answer in
time counts as not committed. A store error is retried a few times with back-off; a refusal
(fenced out) is final.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from contend.errors import ContendError, FencedOut, LeaseLost
from contend.runtime.clock import Clock
from contend.runtime.hooks import Hook, Outcome
from contend.runtime.session import Session
from contend.store.port import Completion, Failure, Store

log = logging.getLogger("contend.expert")

#: Tries of one batch before giving up on it (its tasks are then released by lease expiry).
TRIES = 5
#: The first back-off after a failed try, seconds; it doubles, with up to 100 % jitter.
BACKOFF = 0.05


class _Pending(NamedTuple):
    """An outcome waiting to be sent, with the session it was earned under (a named tuple:
    one is made per task)."""

    outcome: Outcome
    session: Session


#: At most this many turns of the event loop gather a batch (``Committer.run``).
GATHER_TURNS = 4


class Committer:
    """Batches outcomes into fenced commits; ``run`` until ``close``."""

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        clock: Clock,
        hooks: Hook,
        lose: Callable[[Session, str], object],
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.store = store
        self.name = name
        self.clock = clock
        self.hooks = hooks
        self._lose = lose
        self._rand = rand
        self._outbox: list[_Pending] = []
        self._inflight: set[str] = set()  # ids of outcomes being committed right now
        self._ready = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    # -- what the other parts see ----------------------------------------------------------
    def send(self, outcome: Outcome, session: Session) -> None:
        self._outbox.append(_Pending(outcome, session))
        self._ready.set()

    def pending_ids(self) -> set[str]:
        """Tasks whose outcome is waiting or being committed."""
        return {p.outcome.task_id for p in self._outbox} | self._inflight

    def drop(self, session: Session) -> int:
        """Forget every unsent outcome earned under *session* (it was lost); returns how many."""
        kept = [p for p in self._outbox if p.session is not session]
        dropped = len(self._outbox) - len(kept)
        self._outbox = kept
        return dropped

    # -- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"contend-committer-{self.name}")

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self._outbox:
                # let tasks finishing in this same tick join the batch, and those whose
                # results a moment behind (plain functions' come back from their threads
                # in a callback of their own): a few turns of the loop while it grows
                for _ in range(GATHER_TURNS):
                    before = len(self._outbox)
                    await asyncio.sleep(0)
                    if len(self._outbox) == before:
                        break
                await self.flush()
            if self._closing and not self._outbox:
                return

    async def close(self, timeout: float = 10.0) -> None:
        """Commit what is left (waiting up to *timeout* seconds), then stop."""
        self._closing = True
        self._ready.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await self.clock.wait_for(task, timeout)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
            except Exception as exc:
                log.error("expert %s: the committer crashed: %r", self.name, exc)
        if self._outbox:
            await self.flush()

    async def flush(self) -> None:
        batch, self._outbox = self._outbox, []
        if not batch:
            return
        self._inflight = {p.outcome.task_id for p in batch}
        try:
            await self._commit(batch)
        finally:
            self._inflight = set()

    async def _commit(self, batch: list[_Pending]) -> None:
        by_session: dict[Session, list[Outcome]] = {}
        for p in batch:
            by_session.setdefault(p.session, []).append(p.outcome)
        for session, outcomes in by_session.items():
            if session.safe():
                await self._commit_under(session, outcomes)
                continue
            # back in the outbox, so that declaring the loss drops (and counts) them too
            self._outbox[:0] = [_Pending(o, session) for o in outcomes]
            if session.lost.is_set():
                self.drop(session)
            else:
                self._lose(session, "no renewal within the lease")

    async def _commit_under(self, session: Session, outcomes: list[Outcome]) -> None:
        """Results in one ``complete``, failures in one ``fail``, each retried on its own."""
        done = [o for o in outcomes if isinstance(o, Completion)]
        failed = [o for o in outcomes if isinstance(o, Failure)]
        if done:
            await self._commit_part(
                session, done, functools.partial(self.store.complete, self.name, done)
            )
        if failed:
            await self._commit_part(
                session, failed, functools.partial(self.store.fail, self.name, failed)
            )

    async def _commit_part(
        self,
        session: Session,
        items: Sequence[Outcome],
        make: Callable[[], Awaitable[list[FencedOut | None]]],
    ) -> None:
        try:
            results = await self._try(session, make)
        except LeaseLost as exc:
            # not sent, or no answer before the deadline: none of it counts as committed
            log.warning("expert %s: %d outcome(s) not committed: %s", self.name, len(items), exc)
            self._lose(session, str(exc))
            return
        if results is None:
            log.error(
                "expert %s: giving up on %d commit(s); they will be released and run again",
                self.name,
                len(items),
            )
            return
        for outcome, refusal in zip(items, results, strict=True):
            if refusal is None:
                self.hooks.on_committed(self.name, outcome)
            else:
                self.hooks.on_fenced_out(self.name, outcome, refusal)

    async def _try(
        self, session: Session, make: Callable[[], Awaitable[list[FencedOut | None]]]
    ) -> list[FencedOut | None] | None:
        """``make()`` under *session*, retried on store errors; None after TRIES. Raises
        LeaseLost once the session cannot commit any more."""
        for attempt in range(TRIES):
            try:
                return await session.call("a commit", make)
            except LeaseLost:
                raise
            except ContendError as exc:
                log.warning("expert %s: commit failed (try %d): %s", self.name, attempt + 1, exc)
                await self.clock.sleep(BACKOFF * 2**attempt * (1 + self._rand()))
        return None
