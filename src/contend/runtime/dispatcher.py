"""The leader's part of a ``central`` queue, run by every expert that serves one.

Each round it tries to take or renew the queue's leadership (``CentralDispatch.lead``). The
expert that holds it reads the queue's pending tasks that need an assignee and the live
experts that serve the queue, plans with ``contend.domain.dispatch.plan`` (free slots from
their heartbeats, fitness from ``contend.domain.scoring``) and sends the plan with its term;
the store refuses it if the term is over (``NotLeader``), and the expert then leads no more
until it takes the leadership again. The others retry often enough to take over within one
lease of the leader's death, and at once when a supervisor ends its session.

The leader plans again when the store changes (a submission, a claim), not on a fixed poll;
a renewal is a write, so it is sent only every ``every`` seconds, never at each wake-up."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import replace

from contend.domain.dispatch import Worker, free_slots, plan
from contend.domain.scoring import Fitness
from contend.errors import ConfigError, ContendError, LeaseLost, NotLeader, shown_url
from contend.runtime.clock import Clock, give_up, wait_event
from contend.runtime.competition import Competition, expert_view
from contend.runtime.session import LeaseKeeper, Session
from contend.store.port import CentralDispatch, ExpertRecord, Store

log = logging.getLogger("contend.expert")

#: A leadership lasts this share of the expert's lease, so that with the others retrying
#: every ``lease / ROUNDS`` one of them takes over within one lease of the leader's death.
LEAD_SHARE = 2 / 3
ROUNDS = 6
#: At most this many tasks planned in one round (more wait for the next one).
PLAN_MOST = 1000


def leadership(queue: str) -> str:
    """The name of a central queue's leadership in the store."""
    return f"queue:{queue}"


def central_store(store: Store, queues: Sequence[str]) -> CentralDispatch:
    """*store* as a :class:`CentralDispatch`, or the ConfigError that says it is not one."""
    if store.promises.central_dispatch and isinstance(store, CentralDispatch):
        return store
    raise ConfigError(
        f"queue(s) {', '.join(queues)} are central, and the store {shown_url(store.url)} does "
        "not dispatch central queues yet; use SQLite, etcd or the memory store, or make them "
        "'compete' or 'fifo'"
    )


class Dispatcher:
    """Leads (when it can) the central *queues* this expert serves."""

    def __init__(
        self,
        store: Store,
        name: str,
        queues: Sequence[str],
        *,
        keeper: LeaseKeeper,
        competition: Competition,
        fitness: Fitness,
        lease_ttl: float,
        clock: Clock,
        stopping: asyncio.Event,
    ) -> None:
        self.store = store
        self.central = central_store(store, queues)
        self.name = name
        self.queues = list(queues)
        self.keeper = keeper
        self.competition = competition
        self.fitness = fitness
        self.ttl = lease_ttl * LEAD_SHARE
        self.every = lease_ttl / ROUNDS
        self.clock = clock
        self.stopping = stopping
        #: queue -> the term this expert leads it at (absent: it does not lead it).
        self.terms: dict[str, int] = {}
        self.assigned = 0  # tasks given out while leading, for tests and metrics
        self._renew_at = 0.0

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.terms.clear()  # it leads nothing once stopped (its session ends next)

    async def _run(self) -> None:
        while not self.stopping.is_set():
            session = self.keeper.session
            if session is None or session.lost.is_set():
                self.terms.clear()
                await wait_event(self.clock, self.keeper.ready, self.every)
                await asyncio.sleep(0)  # ready may be set still: never spin without yielding
                continue
            if not session.safe():  # its deadline passed (a pause): it leads nothing more
                self.terms.clear()
                self.keeper.lose(session, "no renewal within the lease")
                continue
            try:
                if self.clock.monotonic() >= self._renew_at:
                    await self._lead(session)
                for queue, term in list(self.terms.items()):
                    await self._dispatch(session, queue, term)
            except NotLeader as exc:
                log.warning("expert %s: no longer leads: %s", self.name, exc)
                self.terms.pop(_queue_of(exc.name), None)
                continue
            except LeaseLost as exc:
                self.terms.clear()
                self.keeper.lose(session, str(exc))
                continue
            except ContendError as exc:
                log.warning("expert %s: central dispatch failed: %s", self.name, exc)
            await self._wait()

    async def _lead(self, session: Session) -> None:
        """Take or renew the leadership of each queue; note the terms held."""
        self._renew_at = self.clock.monotonic() + self.every
        for queue in self.queues:
            name = leadership(queue)
            term = await session.call(
                "a leadership",
                functools.partial(self.central.lead, self.name, session.id, name, self.ttl),
            )
            if term is None:
                self.terms.pop(queue, None)
                continue
            if self.terms.get(queue) != term:
                log.info("expert %s leads central queue %s at term %d", self.name, queue, term)
            self.terms[queue] = term

    async def _dispatch(self, session: Session, queue: str, term: int) -> None:
        """One plan for *queue*, sent under *term*."""
        experts = await session.call("a read", self.store.list_experts)
        serving = [p for p in experts if p.alive and queue in p.info.queues]
        live = [p.info.id for p in serving]
        backlog = await session.call(
            "a read", functools.partial(self.central.central_backlog, [queue], live, PLAN_MOST)
        )
        if not backlog.unassigned:
            return
        workers = [
            self._worker(p, backlog.held.get(p.info.id, 0), backlog.assigned.get(p.info.id, 0))
            for p in serving
        ]
        chosen = plan(backlog.unassigned, workers, self.fitness)
        if not chosen:
            return
        name = leadership(queue)
        assign = functools.partial(self.central.assign, self.name, session.id, name, term, chosen)
        given = await session.call("an assignment", assign)
        self.assigned += given

    def _worker(self, p: ExpertRecord, held: int, assigned: int) -> Worker:
        """*p* as the plan sees it: its load is what the store says it holds now (its last
        heartbeat may be a third of a lease old: a slot freed since would wait that long)."""
        view = replace(expert_view(p, self.competition.typical), load=held)
        free = free_slots(p.info.capacity, held, assigned, ahead=p.info.capacity)
        return Worker(view, frozenset(p.info.queues), free, frozenset(p.info.task_types))

    async def _wait(self) -> None:
        """Until the store changes (while leading) or the next leadership round."""
        wait = max(0.0, self._renew_at - self.clock.monotonic())
        if not self.terms:
            await wait_event(self.clock, self.stopping, wait)
            return
        waiter = asyncio.create_task(self.store.wait_for_change(wait))
        stopper = asyncio.create_task(self.stopping.wait())
        try:
            await self.clock.wait_for(
                asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED), wait
            )
        except TimeoutError:
            pass
        finally:
            give_up(waiter)
            stopper.cancel()
            await asyncio.gather(stopper, return_exceptions=True)


def _queue_of(name: str) -> str:
    return name.removeprefix("queue:")
