"""One claim() call on etcd, round by round: read the candidates still pending, keep their
auctions' order and their limits, and commit the claim Txns (see claims.py for the protocol).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from contend.domain import transitions as rules
from contend.domain.limits import admit, rooms
from contend.domain.task import TaskState, load_trace
from contend.domain.transitions import Outcome
from contend.store.etcd.auctions import Turn, turns
from contend.store.etcd.candidates import Rank, rank_of
from contend.store.etcd.levels import RISE_OPS, LevelRead
from contend.store.etcd.outcomes import apply_outcome
from contend.store.etcd.owner import remember_owned
from contend.store.etcd.ownership import batch_value
from contend.store.etcd.payloads import Args, read_payloads
from contend.store.etcd.rates import RateState, rate_state, rooms_of, spend_ops
from contend.store.etcd.record import KV, Record
from contend.store.etcd.txn import Op, get, mod_is, put, value_is, written_before
from contend.store.port import Claimed, Outrun

if TYPE_CHECKING:
    from contend.store.etcd.claims import Claims

#: After a rival wins one of its claim batches, an instance spreads its claims this many seconds.
CONTENDED_FOR = 2.0
#: The most operations one task's claim puts in a transaction (the record, the index delete,
#: a central task's assignment); its compares are fewer (the record, and an auction's two).
#: The Txn puts one ownership key more for all its tasks (ownership.py).
CLAIM_OPS = 3
#: How many times one claim reads an auctioned task again when its auction moved under it.
AUCTION_RETRIES = 3
#: How many times one claim tries again, on fresh counts, tasks whose limit key's holders
#: changed under it.
LIMIT_RETRIES = 8

#: A task to claim: (id, its record's KeyValue as read, its args, its checkpoint).
Try = tuple[str, Any, Any, Any]
#: The candidates read again, without the tasks of these limit keys.
Refill = Callable[[set[str]], Awaitable[list[str]]]


class Claimant(NamedTuple):
    """The live session a claim or a steal is made for."""

    expert: str
    session: str
    lease: int  # the session's etcd lease, which its session key is on
    value: bytes  # the session key's value (l/{expert}), compared by every claim
    ttl: float  # the lease's TTL, for the deadlines reported


def claimed(rec: Record, args: Args, checkpoint: Any, lease_deadline: float) -> Claimed:
    return Claimed(
        id=rec.id,
        type=rec.type,
        queue=rec.queue,
        args=args[0],
        kwargs=args[1],
        fence=rec.fence,
        attempt=rec.attempts,
        max_attempts=rec.max_attempts,
        checkpoint=checkpoint,
        timeout=rec.timeout,
        lease_deadline=lease_deadline,
        priority=rec.priority,
        trace=load_trace(rec.trace),
    )


class Limits(NamedTuple):
    """What the limits of one claim Txn's tasks add to it (``ClaimRun._limits``)."""

    compares: list[Op]
    puts: list[Op]  # the rate keys' new state
    again: list[Op]  # the failure branch's reads, after the session's
    limited: list[str]  # the keys with a concurrency limit, whose holders are compared
    rated: list[str]  # the rate keys compared and put
    moved: dict[str, float]  # rate key -> its new tat
    keyed: bool  # any of the tasks has a limit key


class ClaimRun:
    """One claim() call: rounds of claim transactions over the candidates, in order, until
    enough were won or the candidates ran out."""

    __slots__ = (
        "blocked",
        "claimant",
        "claims",
        "counts",
        "keyed",
        "known",
        "limit_retries",
        "lost",
        "now",
        "orders",
        "outcome",
        "outrun",
        "parsed",
        "rates",
        "reads",
        "refill",
        "retries",
        "session_key",
        "turns",
        "won",
    )

    def __init__(
        self,
        claims: Claims,
        claimant: Claimant,
        now: float,
        start: bool,
        reads: dict[str, LevelRead],
        keyed: dict[str, str] | None = None,
        refill: Refill | None = None,
        known: dict[str, Any] | None = None,
    ) -> None:
        self.claims = claims
        self.claimant = claimant
        self.now = now
        self.outcome: Outcome = rules.claimed(claimant.expert, start=start)
        self.reads = reads  # task id -> the read of its level
        self.session_key = claims.keys.session(claimant.expert)
        self.won: list[tuple[Rank, Claimed]] = []
        self.lost = False  # the session was found ended
        self.outrun = False  # a rival took a task this claim tried
        self.orders: dict[str, Rank] = {}  # task id -> its claim order
        self.parsed: dict[str, Record] = {}  # records parsed by the round's check, used once
        self.turns: dict[str, Turn] = {}  # auctioned task id -> the auction its claim compares
        self.retries = 0  # the tries read again after their auction moved
        self.counts: dict[str, tuple[int, int]] = {}  # limit key -> (holders, counted at rev)
        self.rates: dict[str, RateState] = {}  # rate key -> its r/ key as last read
        self.limit_retries = 0  # the tries made again after their limit key's holders moved
        self.keyed = keyed or {}  # candidate id -> its limit key, from the index
        self.blocked: set[str] = set()  # limit keys found with no room left in this claim
        self.refill = refill  # the candidates without the blocked keys' tasks (once)
        # task id -> its record's KeyValue, read by the caller a moment ago (a named claim
        # reads the records it was named to choose among): the first round's tries of them
        # read nothing more, a round trip less; the Txn's compare of each record's revision
        # refuses one that moved since
        self.known = known or {}

    async def run(self, cands: list[str], limit: int) -> list[Claimed]:
        """Rounds: try as many candidates as claims are still wanted, in order, until enough
        were won or the candidates ran out. The tries of a round are grouped into as few
        transactions as etcd's operation limit allows, committed concurrently."""
        room = self.claims.etcd.max_ops - 2 - RISE_OPS  # the meta compare, the ownership key
        won = self.won
        rest = cands
        tried: set[str] = set()
        while rest and len(won) < limit and not self.lost:
            batch, rest = rest[: limit - len(won)], rest[limit - len(won) :]
            tried.update(batch)
            tries = await self._ready(batch)
            keyed = any(self._limit_key(t) is not None for t in tries)
            # a keyed task's holder key, and its rate key's put and compare
            per_txn = max(1, room // (CLAIM_OPS + 2 * keyed))
            await asyncio.gather(
                *(self._group(tries[i : i + per_txn]) for i in range(0, len(tries), per_txn))
            )
            if self.blocked:  # pass over the other tasks of keys at their limit, unread
                rest = [t for t in rest if self.keyed.get(t) not in self.blocked]
                if not rest and len(won) < limit and self.refill is not None and not self.lost:
                    # the head of a level may be all tasks of such keys: read past them, once
                    refill, self.refill = self.refill, None
                    rest = [t for t in await refill(set(self.blocked)) if t not in tried]
        if self.lost:
            # Claims won in the same round vanished with the lease; expire() returns them.
            raise self.claims.lost_session(self.claimant)
        won.sort(key=lambda w: w[0])
        got = [c for _, c in won]
        # Short because rivals took tasks it tried: more may be pending, which no change of
        # work will announce (a burst's backlog was there all along): the claimant looks
        # again soon instead of waiting out its idle wait (4 experts draining a burst of
        # 20,000: one expert got 14 % of its share, waiting 1 s after each lost race)
        return Outrun(got) if self.outrun and len(got) < limit else got

    async def _ready(self, batch: list[str]) -> list[Try]:
        """The tasks of *batch* still pending and due, and not held back by an auction, with
        their payloads, as read now; of those with a concurrency limit, the ones their limit
        keys have room for. The holders of the limit keys the index told are counted beside
        the read of the records, those of other keys (a named claim) beside the payloads'."""
        now = self.now
        etcd, keys = self.claims.etcd, self.claims.keys
        early = list(dict.fromkeys(self.keyed[t] for t in batch if t in self.keyed))
        known = {tid: self.known.pop(tid) for tid in batch if tid in self.known}
        unread = [tid for tid in batch if tid not in known]
        read, counted = await asyncio.gather(
            etcd.read_many([keys.task(tid) for tid in unread] + [keys.rate(k) for k in early]),
            etcd.counts([keys.holders(k) for k in early]),
        )
        self.counts.update(zip(early, counted, strict=True))
        self._rates_read(early, read[len(unread) :])
        known.update(zip(unread, read, strict=False))
        records = [known[tid] for tid in batch]
        ready: list[tuple[str, Any, Record]] = []
        for tid, t in zip(batch, records, strict=True):
            if t is None:
                self.outrun = True  # gone since the index was read: a rival finished it
                continue
            rec = Record.loads(t.value)
            if rec.state != TaskState.PENDING:
                self.outrun = True  # a rival claimed it since the index was read
            if (
                rec.state == TaskState.PENDING
                and rec.indexed
                and rec.run_at <= now
                and (not rec.central or rec.assignee == self.claimant.expert)
            ):
                ready.append((tid, t, rec))
        tries: list[Try] = []
        recs = [rec for _, _, rec in ready]
        limited = list(dict.fromkeys(k for k in (rec.limit_key for rec in recs) if k is not None))
        late = [k for k in limited if k not in early]
        payloads, turn, counted, rated = await asyncio.gather(
            read_payloads(etcd, keys, recs, result=False),
            turns(etcd, keys, self.claimant.expert, now, recs),
            etcd.counts([keys.holders(k) for k in late]),
            etcd.read_many([keys.rate(k) for k in late]),
        )
        self.counts.update(zip(late, counted, strict=True))
        self._rates_read(late, rated)
        for (tid, t, rec), (a, _, c) in zip(ready, payloads, strict=True):
            if a is None:  # not written yet: the submission is still going on
                continue
            if tid in turn:
                mine = turn[tid]
                if mine is None:  # its auction holds this expert back
                    continue
                self.turns[tid] = mine
            tries.append((tid, t, a, c))
            self.parsed[tid] = rec
        return self._admit(tries) if limited else tries

    def _rates_read(self, limit_keys: Sequence[str], kvs: Sequence[Any]) -> None:
        """Take the ``r/`` keys of *limit_keys* as read (absent: the key has no rate)."""
        for key, kv in zip(limit_keys, kvs, strict=True):
            state = rate_state(kv)
            known = self.rates.get(key)
            if state is None:
                self.rates.pop(key, None)
            elif known is None or state.mod_revision >= known.mod_revision:
                self.rates[key] = state

    def _limit_key(self, t: Try) -> str | None:
        rec = self.parsed.get(t[0]) or Record.loads(t[1].value)
        return rec.limit_key

    def _admit(self, tries: list[Try]) -> list[Try]:
        """The tries, in order, that their limit keys have room for, by the last counts."""
        picks = []
        for tid, t, _, _ in tries:
            rec = self.parsed.get(tid) or Record.loads(t.value)
            picks.append((tid, rec.limit_key, rec.concurrency_limit))
        held = {k: n for k, (n, _) in self.counts.items()}
        room = rooms(rooms_of(self.rates), self.now)
        ok = set(admit(picks, held, len(tries), room))
        for tid, key, _ in picks:
            if tid not in ok:
                self.parsed.pop(tid, None)
                assert key is not None  # admit() takes every try without a key
                self.blocked.add(key)
        return [g for g in tries if g[0] in ok]

    def _limits(self, recs: Sequence[Record]) -> Limits:
        """For a claim Txn of *recs*: the compares that the holders of their limit keys with
        a concurrency limit are as counted (none was put since) and that their rate keys are
        as read, the puts of the rate keys' new state, the failure reads that count and read
        them again, and those keys."""
        keys = self.claims.keys
        limited = list(
            dict.fromkeys(k for r in recs if r.concurrency_limit is not None and (k := r.limit_key))
        )
        cmp = [written_before(keys.holders(k), self.counts[k][1] + 1) for k in limited]
        again = [get(keys.holders(k), prefix=True, count_only=True) for k in limited]
        claimed = [r.limit_key for r in recs]
        rcmp, puts, rated, moved = spend_ops(keys, self.rates, claimed, self.now)
        return Limits(
            [*cmp, *rcmp],
            puts,
            [*again, *(get(keys.rate(k)) for k in rated)],
            limited,
            rated,
            moved,
            any(k is not None for k in claimed),
        )

    def _recount(self, resp: Any, lim: Limits) -> None:
        """Take the counts and rate keys a failed claim Txn's failure branch read (after the
        session's)."""
        rev = int(resp.header.revision)
        got = resp.responses[1:]
        for k, r in zip(lim.limited, got, strict=False):
            self.counts[k] = (int(r.response_range.count), rev)
        rated = got[len(lim.limited) :]
        kvs = [r.response_range.kvs[0] if r.response_range.kvs else None for r in rated]
        self._rates_read(lim.rated, kvs)

    def _spent(self, lim: Limits, rev: int) -> None:
        """A claim Txn that moved rate keys landed at revision *rev* (0: unknown, a lost
        reply: the next compare then fails, and its failure branch reads the key again)."""
        for key, tat in lim.moved.items():
            state = self.rates.get(key)
            if state is not None and (not rev or rev > state.mod_revision):
                self.rates[key] = RateState(state.rate, tat, rev)

    def _prepare(self, tid: str, t: Any) -> tuple[list[Op], list[Op], Record]:
        """(compares, operations, new record) that claim one task read as *t*."""
        now, who, keys = self.now, self.claimant, self.claims.keys
        rec = self.parsed.pop(tid, None) or Record.loads(t.value)
        assert rec.indexed
        turn = self.turns.get(tid)
        if turn is not None and not turn.auctioned:
            rec.auctioned = False  # its auction was cleared: later claims need not look
        self.orders[tid] = rank_of(rec, now)
        rec.owner = who.expert
        rec.session = who.session
        rec.fence += 1
        rec.lease_deadline = now + who.ttl
        ops = apply_outcome(keys, rec, self.outcome, now)  # out of the priority index
        return (
            # pending as read, with its auction as read
            [mod_is(t.key, t.mod_revision), *(turn.compares if turn is not None else ())],
            [put(t.key, rec.dumps()), *ops],
            rec,
        )

    def _finish(self, tid: str, a: Any, c: Any, rec: Record, ops: list[Op], rev: int) -> None:
        """Record a claim that landed at revision *rev* (0: unknown, a lost reply)."""
        self.claims.claimed.add(self.claimant.session, [tid])
        if rev:
            session = KV(self.session_key, self.claimant.value, 0)
            remember_owned(self.claims.owned, tid, ops[0], session, rev, rec)
        self.won.append((self.orders[tid], claimed(rec, a, c, self.now + self.claimant.ttl)))

    def _session_lost(self, resp: Any) -> bool:
        kvs = resp.responses[0].response_range.kvs
        return not kvs or kvs[0].value != self.claimant.value

    def _contended(self) -> None:
        self.outrun = True
        self.claims.contended_until = time.monotonic() + CONTENDED_FOR

    def _owning(self, recs: Sequence[Record]) -> tuple[bytes, Op]:
        """A new ownership key for the tasks of one claim Txn, and its put."""
        who = self.claimant
        key = self.claims.batches.key(self.claims.keys, who.expert, who.session)
        return key, put(key, batch_value(r.id for r in recs))

    def _owned(self, key: bytes, recs: Sequence[Record]) -> None:
        """The claim Txn that put the ownership key *key* for *recs* landed."""
        self.claims.batches.opened(key, self.claimant.session, {r.id: r.fence for r in recs})

    async def _one(self, tid: str, t: Any, a: Any, c: Any) -> None:
        """One claim transaction for one task (the fallback when a batch lost a race)."""
        cmp, ops, rec = self._prepare(tid, t)
        levels = self.claims.levels
        up = levels.rises([tid], self.reads)
        lim = self._limits([rec])
        bkey, owning = self._owning([rec])
        resp = await self.claims.etcd.commit(
            [*cmp, *lim.compares, value_is(self.session_key, self.claimant.value)],
            [*ops, owning, *lim.puts, *up],
            [get(self.session_key)],
        )
        if resp is not None and not resp.succeeded:
            if self._session_lost(resp):
                self.lost = True
                return
            if (lim.limited or lim.rated) and self.limit_retries < LIMIT_RETRIES:
                # a rival took a place of its key, or the task: the task read again tells
                self.limit_retries += 1
                self._contended()
                for again in await self._ready([tid]):
                    await self._one(*again)
                return
            if tid in self.turns and self.retries < AUCTION_RETRIES:
                # a bid landed, or a rival won it: which one, the task read again tells
                self.retries += 1
                del self.turns[tid]
                for again in await self._ready([tid]):
                    await self._one(*again)
                return
            self._contended()
            return  # another expert won this one, or the session ended
        levels.risen(up)
        rev = resp.header.revision if resp is not None else 0
        self._spent(lim, rev)
        self._owned(bkey, [rec])
        self._finish(tid, a, c, rec, ops, rev)

    async def _group(self, group: list[Try]) -> None:
        """Claim a group of tasks in one transaction: every task's revision and the live
        session are compared at once. When any task moved
        meanwhile (a rival claimed it), one read tells which: the tasks still as read are
        tried again together, the others are left to the rival."""
        levels = self.claims.levels
        while group:
            if len(group) == 1:
                await self._one(*group[0])
                return
            plans = [self._prepare(tid, t) for tid, t, _, _ in group]
            up = levels.rises([g[0] for g in group], self.reads)
            lim = self._limits([p[2] for p in plans])
            bkey, owning = self._owning([p[2] for p in plans])
            resp = await self.claims.etcd.commit(
                [
                    *(x for p in plans for x in p[0]),
                    *lim.compares,
                    value_is(self.session_key, self.claimant.value),
                ],
                [*(x for p in plans for x in p[1]), owning, *lim.puts, *up],
                [get(self.session_key), *lim.again],
            )
            if resp is None or resp.succeeded:
                levels.risen(up)
                rev = resp.header.revision if resp is not None else 0
                self._spent(lim, rev)
                self._owned(bkey, [p[2] for p in plans])
                for (tid, _, a, c), (_, ops, rec) in zip(group, plans, strict=True):
                    self._finish(tid, a, c, rec, ops, rev)
                return
            if self._session_lost(resp):
                self.lost = True
                return
            still = await self._still_as_read(group)
            self._contended()
            if lim.limited or lim.rated:  # what the failure branch read: the room left now
                self._recount(resp, lim)
                still = self._admit(still)
                if len(still) == len(group) and self.limit_retries < LIMIT_RETRIES:
                    self.limit_retries += 1  # a key's holders moved, maybe: again, together
                    group = still
                    continue
            if len(still) == len(group):  # cannot tell what moved: one at a time
                await asyncio.gather(*(self._one(*g) for g in group))
                return
            group = still

    async def _still_as_read(self, group: list[Try]) -> list[Try]:
        """The tasks of *group* that did not move since they were read (one read: a lost
        race is rare once claims spread out)."""
        now_kvs = await self.claims.etcd.read_many([t.key for _, t, _, _ in group])
        return [
            g
            for kv, g in zip(now_kvs, group, strict=True)
            if kv is not None and kv.mod_revision == g[1].mod_revision
        ]
