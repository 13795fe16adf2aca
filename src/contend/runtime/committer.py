"""The committer: finished runs' outcomes, grouped into fenced ``complete``/``fail`` calls.

Outcomes that arrive in the same turn of the event loop go to the store together: one
``complete`` for the results and one ``fail`` for the failures of a batch. Each outcome carries
the session it was earned under and is committed only while that session is safe; a session
that lapsed is declared lost (which drops every unsent outcome of it) and nothing of it is sent.
A store error is retried a few times with back-off; a refusal (fenced out) is final.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from contend.errors import ContendError, FencedOut
from contend.runtime.clock import Clock
from contend.runtime.hooks import Hook, Outcome
from contend.runtime.session import Session
from contend.store.port import Completion, Failure, Store

log = logging.getLogger("contend.expert")

#: Tries of one batch before giving up on it (its tasks are then released by lease expiry).
TRIES = 5
#: The first back-off after a failed try, seconds; it doubles, with up to 100 % jitter.
BACKOFF = 0.05


@dataclass(frozen=True, slots=True)
class _Pending:
    outcome: Outcome
    session: Session


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
                await asyncio.sleep(0)  # let tasks finishing in this same tick join the batch
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
        safe = [p.outcome for p in batch if p.session.safe()]
        unsafe = [p for p in batch if not p.session.safe()]
        if unsafe:
            # back in the outbox, so that declaring the loss drops (and counts) them too
            self._outbox[:0] = unsafe
            for session in dict.fromkeys(p.session for p in unsafe):
                if session.lost.is_set():
                    self.drop(session)
                else:
                    self._lose(session, "no renewal within the lease")
        done = [o for o in safe if isinstance(o, Completion)]
        failed = [o for o in safe if isinstance(o, Failure)]
        if not done and not failed:
            return
        results = await self._send(done, failed)
        if results is None:
            log.error(
                "expert %s: giving up on %d commit(s); they will be released and run again",
                self.name,
                len(done) + len(failed),
            )
            return
        sent: list[Outcome] = [*done, *failed]
        for outcome, refusal in zip(sent, results, strict=True):
            if refusal is None:
                self.hooks.on_committed(self.name, outcome)
            else:
                self.hooks.on_fenced_out(self.name, outcome, refusal)

    async def _send(
        self, done: list[Completion], failed: list[Failure]
    ) -> list[FencedOut | None] | None:
        """One complete and one fail call, retried on store errors; None after TRIES."""
        for attempt in range(TRIES):
            try:
                results: list[FencedOut | None] = []
                if done:
                    results += await self.store.complete(self.name, done)
                if failed:
                    results += await self.store.fail(self.name, failed)
            except ContendError as exc:
                log.warning("expert %s: commit failed (try %d): %s", self.name, attempt + 1, exc)
                await self.clock.sleep(BACKOFF * 2**attempt * (1 + self._rand()))
            else:
                return results
        return None
