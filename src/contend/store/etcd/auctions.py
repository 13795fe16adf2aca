"""Auctions: ``u/{task}`` holds the close and the grace, written by the first bid, and
``b/{task}/{expert}`` each bid. Bids outlive their bidder (the grace period lets the next
bidder claim); expire() drops the auctions and bids of tasks that are no longer pending.

Claims keep the auction's order (``contend.domain.auction``) at no cost to a task nobody bid
on: the bid that opens an auction also marks the task record (``Record.auctioned``) in the
Txn that compares the record's revision, so a claim that read the record unmarked, and
compares that revision, knows no auction opened before its Txn. Only for a marked task does a
claim read ``u/`` and ``b/`` (:func:`turns`), and its Txn then compares both as read:
the ranking the claim was allowed by is the one in force when it lands."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from contend.domain import auction
from contend.domain.task import TaskState
from contend.errors import StoreError, TaskNotFound
from contend.store._common import check_bid
from contend.store.etcd.keys import Keys, enc, unenc
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions
from contend.store.etcd.txn import (
    WRITE_RETRIES,
    Op,
    absent,
    delete,
    get,
    mod_is,
    put,
    value_is,
    written_before,
)
from contend.store.port import Auction

#: {expert: (score, placed_at)}, as ``contend.domain.auction.rank_bids`` takes them.
Bids = dict[str, tuple[float, float]]


def _opened(value: bytes) -> tuple[float, float]:
    """(closes_at, grace) of a ``u/`` value (one written before grace was kept: the default)."""
    u = json.loads(value)
    return float(u["closes_at"]), float(u.get("grace", auction.DEFAULT_GRACE))


def _placed(prefix: bytes, kvs: Sequence[Any]) -> Bids:
    """The bids read under *prefix* (``b/{task}/``)."""
    out: Bids = {}
    for kv in kvs:
        b = json.loads(kv.value)
        out[unenc(kv.key[len(prefix) :].decode())] = (float(b["score"]), float(b["at"]))
    return out


class Auctions:
    def __init__(
        self, etcd: Etcd, keys: Keys, clock: Callable[[], float], sessions: Sessions
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self._sessions = sessions

    async def bid(
        self,
        expert: str,
        session: str,
        task_id: str,
        score: float,
        window: float,
        grace: float = auction.DEFAULT_GRACE,
    ) -> Auction:
        score, window, grace = check_bid(score, window, grace)
        keys = self._keys
        tkey, ukey, bids_prefix = keys.task(task_id), keys.auction(task_id), keys.bids(task_id)
        mine = bids_prefix + enc(expert).encode()
        for _ in range(WRITE_RETRIES):
            _, session_value = await self._sessions.check(expert, session)
            reads = await self._etcd.reads([get(tkey), get(ukey), get(bids_prefix, prefix=True)])
            t, u, bids = (r.kvs for r in reads)
            now = self._clock()
            if not t:
                raise TaskNotFound(task_id)
            closes, kept = _opened(u[0].value) if u else (now + window, grace)
            rec = Record.loads(t[0].value)
            if rec.state != TaskState.PENDING:
                return Auction(task_id, now, closes if u else now, (), open=False, grace=kept)
            placed = _placed(bids_prefix, bids)
            ops = [] if u else [put(ukey, json.dumps({"closes_at": closes, "grace": kept}))]
            old = placed.get(expert)
            if now < closes and (old is None or old[0] != score):  # sealed at the close
                placed[expert] = (score, old[1] if old else now)
                ops.append(put(mine, json.dumps({"score": score, "at": placed[expert][1]})))
            if not rec.auctioned:  # claims read the auction from now on (module docstring)
                rec.auctioned = True
                ops.append(put(tkey, rec.dumps()))
            cmp = [
                mod_is(tkey, t[0].mod_revision),
                value_is(keys.session(expert), session_value),
                mod_is(ukey, u[0].mod_revision) if u else absent(ukey),
            ]
            if (await self._etcd.txn(cmp, ops)).succeeded:
                return Auction(task_id, now, closes, auction.rank_bids(placed), grace=kept)
        raise StoreError(f"the auction of task {task_id} kept changing; gave up")

    async def clear(self) -> None:
        """Drop the auctions and bids of tasks that are no longer pending."""
        etcd, keys = self._etcd, self._keys
        base = len(keys.auction(""))
        found = await etcd.scan(keys.auction(""), keys_only=True)
        tids = [unenc(kv.key[base:].decode()) for kv in found]
        if not tids:
            return
        recs = await etcd.read_many([keys.task(t) for t in tids])
        for tid, kv in zip(tids, recs, strict=True):
            if kv is None or Record.loads(kv.value).state != TaskState.PENDING:
                cmp = [] if kv is None else [mod_is(kv.key, kv.mod_revision)]
                await etcd.txn(
                    cmp, [delete(keys.auction(tid)), delete(keys.bids(tid), prefix=True)]
                )


class Turn(NamedTuple):
    """An auctioned task *expert* may claim now: what its claim's Txn compares, and whether
    the auction is still there (False: it was cleared, the record's mark can go)."""

    compares: list[Op]
    auctioned: bool


async def turns(
    etcd: Etcd, keys: Keys, expert: str, now: float, recs: Sequence[Record]
) -> dict[str, Turn | None]:
    """For each of *recs* marked auctioned: None when its auction holds *expert* back at *now*
    (``contend.domain.auction.may_claim_at``), else its :class:`Turn`, whose compares are the
    auction and its bids as read here: a bid that lands between this read and the claim's Txn
    (one placed at the close by a clock a little behind) fails the claim. One read of the
    ``u/`` and ``b/`` of every marked task, none when no task is marked."""
    marked = [rec.id for rec in recs if rec.auctioned]
    if not marked:
        return {}
    ops = [op for t in marked for op in (get(keys.auction(t)), get(keys.bids(t), prefix=True))]
    step = max(2, etcd.max_ops - etcd.max_ops % 2)  # a task's two reads share a snapshot
    chunks = await asyncio.gather(
        *(etcd.reads(ops[i : i + step]) for i in range(0, len(ops), step))
    )
    got = [r for chunk in chunks for r in chunk]
    out: dict[str, Turn | None] = {}
    for n, tid in enumerate(marked):
        u, b = got[2 * n], got[2 * n + 1]
        ukey, prefix = keys.auction(tid), keys.bids(tid)
        if not u.kvs:  # cleared, as the task left pending since: it holds nobody back, and
            out[tid] = Turn([absent(ukey)], False)  # a bid opening one now fails the claim
            continue
        closes, grace = _opened(u.kvs[0].value)
        ranked = auction.rank_bids(_placed(prefix, b.kvs))
        if now < auction.may_claim_at(closes, grace, ranked, expert):
            out[tid] = None
        else:
            since = written_before(prefix, int(b.header.revision) + 1)
            out[tid] = Turn([mod_is(ukey, u.kvs[0].mod_revision), since], True)
    return out
