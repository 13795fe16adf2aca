"""Claims and steals: the atomic step that makes an expert's session the owner of tasks.

A claim compares, for each task, the task key's ``mod_revision`` with the one read (the task
was pending then), and that the expert's session key still holds its session; then for each
task it puts the task record (fence + 1, attempts + 1, the owner and session) and deletes
the index key; it puts one ownership key for all its tasks, ``h/{expert}/{session}/{batch}``
(ownership.py), and raises the floors of the levels it took from. Nothing is put on the session's lease but its session key: the owner's
writes compare that key, so the claim lapses with the session. The tasks of one claim
share a Txn (as many as ``max_txn_ops`` allows); when a rival took some of them, one read
tells which, and the others are claimed together in the next Txn. A steal is a fenced
transfer of another expert's claimed, unstarted task, one Txn per task.

A task someone bid on keeps its auction's order (auctions.py): one more read, of the
auctions of such candidates only, leaves out those whose auction holds the expert back, and
the Txn compares the auction of each of the others as read (two compares a task).

A task with a concurrency limit (``contend.domain.limits``) is tried only while its limit
key has room: the round that reads the records also counts the holder keys of their limit
keys (``n/{limit key}/``, one per task of the key claimed or running), ``admit`` keeps the
tries the counts allow, the Txn puts a holder key for each keyed task and compares, once per
limit key, that none of its holder keys was put since the count (so of two claims counting
the same last place, the second fails), and its failure branch counts them again for the
next try. Tasks without a limit cost nothing more: no count, no compare.

A limit key's rate (rates.py, ``r/{limit key}``) is read with the records of its tasks; the
tries its room allows are admitted with the concurrency limits, and the Txn compares the
``r/`` key as read and puts its new ``tat`` (one compare and one put per rate key); its
failure branch reads the key again for the next try. Fair share orders the candidates
before any of this (fair.py).

A central task (dispatch.py) is never a candidate from the priority index: beside its other
reads a claim reads the central tasks a leader gave this expert (``z/{queue}/a/{expert}/``)
and tries them first; a try of a central task lands only if the record as read names this
expert its assignee (the Txn compares the record), and a steal never takes one."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from contend.domain import transitions as rules
from contend.domain.task import Capabilities, Requirements, TaskState
from contend.errors import LeaseLost
from contend.store._common import check_limit, check_ttl, session_not_live
from contend.store.etcd.candidates import Found, Rank, choose, pick, pick_fair, rank_of
from contend.store.etcd.claim_run import (
    Claimant,
    ClaimRun,
    Refill,
    claimed,
)
from contend.store.etcd.dispatch import given, given_reads
from contend.store.etcd.keys import Keys
from contend.store.etcd.levels import LevelRead, Levels
from contend.store.etcd.outcomes import apply_outcome
from contend.store.etcd.owner import Owned
from contend.store.etcd.ownership import batch_value, parse_held
from contend.store.etcd.payloads import read_payloads
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions
from contend.store.etcd.txn import get, mod_is, put, value_is
from contend.store.port import Claimed


class Claims:
    """The claims of one store instance, which spreads them out for CONTENDED_FOR seconds
    after a rival won one of its batches (``contended_until``, monotonic time)."""

    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        clock: Callable[[], float],
        sessions: Sessions,
        levels: Levels,
        owned: Owned,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self._clock = clock
        self._sessions = sessions
        self.claimed = sessions.claimed  # what renew() reads back
        self.batches = sessions.batches  # the ownership keys this instance put
        self.levels = levels
        self.owned = owned
        self.contended_until = 0.0

    async def claim(
        self,
        expert: str,
        session: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
        task_ids: Sequence[str] | None = None,
        start: bool = True,
        low_lane: int = 0,
        types: Collection[str] | None = None,
    ) -> list[Claimed]:
        check_limit(limit)
        check_ttl(lease_ttl)
        if not queues or not limit or (task_ids is not None and not task_ids):
            await self._sessions.check(expert, session)
            return []
        now = self._clock()
        cands: list[str]  # task ids, best first
        reads: dict[str, LevelRead] = {}  # task id -> the read of its level
        keyed: dict[str, str] = {}  # task id -> its limit key, as the index holds it
        refill: Refill | None = None
        known: dict[str, Any] = {}  # task id -> its record as _named read it
        # The session check and the first read overlap: one round trip less per claim.
        if task_ids is None:
            spread = time.monotonic() < self.contended_until
            (lease, session_value, given_kvs), cands = await asyncio.gather(
                self._sessions.check_with(expert, session, given_reads(self.keys, expert, queues)),
                choose(
                    self.levels,
                    queues,
                    capabilities,
                    limit,
                    low_lane,
                    now,
                    spread,
                    reads=reads,
                    types=types,
                    limits=keyed,
                ),
            )

            async def without(hidden: set[str]) -> list[str]:
                """The candidates once more, without the tasks of the limit keys *hidden*."""
                return await choose(
                    self.levels,
                    queues,
                    capabilities,
                    limit,
                    low_lane,
                    now,
                    reads=reads,
                    types=types,
                    hidden=hidden,
                    limits=keyed,
                )

            refill = without
            # the central tasks given to it go first
            mine = given(self.keys, expert, queues, given_kvs, capabilities, now, types, keyed)
            cands = [*mine, *cands]
        else:
            (lease, session_value), cands = await asyncio.gather(
                self._sessions.check(expert, session),
                self._named(
                    expert, task_ids, queues, capabilities, now, types, limit, low_lane, known
                ),
            )
        ttl = json.loads(session_value).get("ttl", lease_ttl)
        claimant = Claimant(expert, session, lease, session_value, ttl)
        if cands:
            await self._sessions.mark_foreign(expert, session, session_value)
        run = ClaimRun(self, claimant, now, start, reads, keyed, refill, known)
        return await run.run(cands, limit)

    async def _named(
        self,
        expert: str,
        task_ids: Sequence[str],
        queues: Sequence[str],
        caps: Capabilities,
        now: float,
        types: Collection[str] | None,
        limit: int,
        low_lane: int,
        known: dict[str, Any],
    ) -> list[str]:
        """The named tasks that may be claimed now, in the order to try them (as
        :func:`~contend.store.etcd.candidates.pick` tells, the low lane's among them): the
        central tasks given to *expert* first (and no other central task). *known* receives
        the record of each, as read."""
        ids = list(dict.fromkeys(task_ids))
        qs = set(queues)
        kinds = None if types is None else set(types)
        kvs = await self.etcd.read_many([self.keys.task(t) for t in ids])
        named: list[Found] = []
        mine: list[tuple[Rank, str]] = []
        fairs: dict[str, str] = {}  # fair task id -> its fair key
        for tid, kv in zip(ids, kvs, strict=True):
            if kv is None:
                continue
            rec = Record.loads(kv.value)
            known[tid] = kv
            if (
                rec.state == TaskState.PENDING
                and rec.indexed
                and rec.run_at <= now
                and rec.queue in qs
                and (kinds is None or rec.type in kinds)
                and caps.satisfies(Requirements.from_json(rec.req))
            ):
                if rec.central:
                    if rec.assignee == expert:
                        mine.append((rank_of(rec, now), tid))
                    continue
                named.append((tid, rank_of(rec, now), (rec.queue, rec.priority)))
                if rec.fair and rec.limit_key is not None:
                    fairs[tid] = rec.limit_key
        named.sort(key=lambda f: f[1])
        first = [tid for _, tid in sorted(mine)]
        if fairs:
            return first + await pick_fair(self.etcd, self.keys, named, fairs, limit, low_lane)
        return first + pick(named, limit, low_lane)

    def lost_session(self, claimant: Claimant) -> LeaseLost:
        """Forget a session a claim found ended; the error to raise."""
        self._sessions.cache.pop(claimant.session, None)
        return session_not_live(claimant.expert, claimant.session)

    # -- steals ------------------------------------------------------------------------------
    async def steal(
        self,
        thief: str,
        session: str,
        victim: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
        types: Collection[str] | None = None,
    ) -> list[Claimed]:
        check_limit(limit)
        check_ttl(lease_ttl)
        lease, session_value = await self._sessions.check(thief, session)
        if not queues or not limit:
            return []
        ttl = json.loads(session_value).get("ttl", lease_ttl)
        loot = await self._loot(victim, queues, capabilities, types)
        claimant = Claimant(thief, session, lease, session_value, ttl)
        if loot:
            await self._sessions.mark_foreign(thief, session, session_value)
        now = self._clock()
        got = await asyncio.gather(*(self._take(claimant, victim, t, now) for t in loot[:limit]))
        if any(lost for _, lost in got):
            raise self.lost_session(claimant)
        taken = [c for c, _ in got if c is not None]
        self.claimed.add(session, [c.id for c in taken])
        return taken

    async def _loot(
        self,
        victim: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        types: Collection[str] | None,
    ) -> list[Any]:
        """Task KeyValues of the victim's claimed, unstarted tasks of these queues (and
        *types*) that *capabilities* can run, the best first: from its live session's
        ownership keys (h/{victim}/{session}/; a read that walks the ones deleted since the
        last compaction: steals are rare, at the end of a burst)."""
        kinds = None if types is None else set(types)
        keys = self.keys
        live = (await self.etcd.read_many([keys.session(victim)]))[0]
        if live is None:
            return []
        session = json.loads(live.value)["session"]
        kvs = await self.etcd.scan(keys.batches(victim, session))
        held = list(dict.fromkeys(tid for tid, _, _ in parse_held(keys, victim, kvs)))
        reads = await self.etcd.read_many([keys.task(t) for t in held])
        qs = set(queues)
        loot: list[tuple[tuple[int, float, str], Any]] = []
        for t in reads:
            if t is None:
                continue
            rec = Record.loads(t.value)
            if (
                rec.session == session
                and rec.owner == victim
                and rec.state == TaskState.CLAIMED
                and not rec.central  # a leader gave it to the victim: never stolen
                and rec.queue in qs
                and (kinds is None or rec.type in kinds)
                and capabilities.satisfies(Requirements.from_json(rec.req))
            ):
                loot.append(((-rec.priority, rec.run_at, rec.id), t))
        loot.sort(key=lambda item: item[0])
        return [t for _, t in loot]

    async def _take(
        self, thief: Claimant, victim: str, t: Any, now: float
    ) -> tuple[Claimed | None, bool]:
        """Move one task from *victim* to *thief*, started; (what was claimed or None, whether
        the thief's session was found ended)."""
        keys = self.keys
        rec = Record.loads(t.value)
        tid = rec.id
        rec.owner, rec.session = thief.expert, thief.session
        rec.fence += 1
        rec.lease_deadline = now + thief.ttl
        moves = apply_outcome(keys, rec, rules.stolen(thief.expert, victim), now)
        session_key = keys.session(thief.expert)
        # the victim's ownership key stays: it lists the task, whose record now names the
        # thief (ownership.py)
        bkey = self.batches.key(keys, thief.expert, thief.session)
        resp = await self.etcd.commit(
            [mod_is(t.key, t.mod_revision), value_is(session_key, thief.value)],
            [put(t.key, rec.dumps()), put(bkey, batch_value([tid])), *moves],
            [get(session_key)],
        )
        if resp is not None and not resp.succeeded:
            kvs = resp.responses[0].response_range.kvs
            # the victim started it, or someone else stole it first
            return None, not kvs or kvs[0].value != thief.value
        self.batches.opened(bkey, thief.session, {tid: rec.fence})
        ((a, _, ck),) = await read_payloads(self.etcd, keys, [rec], result=False)
        return claimed(rec, a if a is not None else ([], {}), ck, now + thief.ttl), False
