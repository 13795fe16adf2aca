"""The ticker: submits the ticks of the app's periodic task types (``@app.periodic``).

Every expert runs one. Each tick is submitted under its idempotency key
(:func:`contend.domain.periodic.tick_key`), so however many experts submit it, the store keeps
one task, and whichever of them dies, the others' submissions still land. A tick is submitted
when it comes, by the wall clock of the host; the task is due at once and claimed like any
other. When the expert starts, and after a stall (the process paused, the host slept), the
schedule's catch-up policy says which of the ticks missed still run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from contend.domain.periodic import tick_key, tick_time
from contend.errors import ContendError
from contend.runtime.app import App, Periodic
from contend.runtime.clock import Clock, wait_event
from contend.store.port import Store

log = logging.getLogger("contend.expert")

#: A tick this late (seconds) still counts as on time, whatever the catch-up policy.
ON_TIME = 5.0
#: First pause after a failed submission, seconds; it doubles up to RETRY_MOST.
RETRY_FIRST = 0.5
RETRY_MOST = 10.0


class Ticker:
    """Submits each periodic task type's ticks until *stopping* is set."""

    def __init__(
        self,
        app: App,
        store: Store,
        name: str,
        *,
        clock: Clock,
        stopping: asyncio.Event,
        retention: float | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.name = name
        self.clock = clock
        self.stopping = stopping
        self.retention = retention
        #: Ticks this expert's submissions created (not those another expert had already).
        self.created: dict[str, list[str]] = {}

    @property
    def schedules(self) -> Mapping[str, Periodic]:
        return self.app.schedules

    async def run(self) -> None:
        if self.schedules:
            await asyncio.gather(*(self._tick(p) for p in self.schedules.values()))

    async def _tick(self, p: Periodic) -> None:
        now, sched = self.clock.now(), p.schedule
        if (
            sched.catch_up == "all"
            and self.retention is not None
            and sched.catch_up_window > self.retention
        ):
            log.warning(
                "expert %s: periodic %s catches up over %.0fs, longer than the retention "
                "(%.0fs): a tick older than the retention that ran may run again",
                self.name,
                p.name,
                sched.catch_up_window,
                self.retention,
            )
        await self._submit(p, sched.missed(now - sched.catch_up_window, now), on_start=True)
        last = now
        while not self.stopping.is_set():
            nxt = sched.after(last)
            if nxt is None:
                log.warning(
                    "expert %s: periodic %s (%s) has no tick within a year: not scheduled",
                    self.name,
                    p.name,
                    sched.describe(),
                )
                return
            wait = nxt - self.clock.now()
            if wait > 0 and await wait_event(self.clock, self.stopping, wait):
                return
            now = self.clock.now()
            if now < nxt:
                continue  # woke a moment early (or the wall clock stepped back)
            # ticks a moment late (a busy host) are on time; older ones were missed in a
            # stall, and the catch-up policy says which of them run
            due = sched.ticks(last, now)
            on_time = [t for t in due if now - t <= ON_TIME] or due[-1:]
            ticks = [t for t in sched.missed(last, now) if t < on_time[0]] + on_time
            await self._submit(p, ticks)
            last = now

    async def _submit(self, p: Periodic, ticks: Sequence[float], *, on_start: bool = False) -> None:
        """Submit *ticks* of *p* in one batch, retrying while the store fails (until a stop;
        the other experts submit the same ticks meanwhile)."""
        if not ticks:
            return
        specs = [
            self.app.build_spec(
                p.name,
                [],
                {"tick": tick_time(t)} if p.wants_tick else None,
                key=tick_key(p.name, t),
            )
            for t in ticks
        ]
        pause = RETRY_FIRST
        while True:
            try:
                answers = await self.store.submit(specs)
                break
            except ContendError as exc:
                log.warning(
                    "expert %s: could not submit periodic %s (%d tick(s)): %s; again in %.1fs",
                    self.name,
                    p.name,
                    len(specs),
                    exc,
                    pause,
                )
                if await wait_event(self.clock, self.stopping, pause):
                    return
                pause = min(RETRY_MOST, pause * 2)
        new = [tick_time(t) for t, a in zip(ticks, answers, strict=True) if a.created]
        if new:
            self.created.setdefault(p.name, []).extend(new)
            log.info(
                "expert %s: periodic %s: %s %s",
                self.name,
                p.name,
                "caught up" if on_start else "tick",
                new[0] if len(new) == 1 else f"{len(new)} ticks, {new[0]} to {new[-1]}",
            )
