"""Auctions: ``u/{task}`` holds the closing time, written by the first bid, and
``b/{task}/{expert}`` each bid. Bids outlive their bidder (the grace period lets the next
bidder claim); expire() drops the auctions and bids of tasks that are no longer pending."""

from __future__ import annotations

import json
from collections.abc import Callable

from contend.domain.task import TaskState
from contend.errors import StoreError, TaskNotFound
from contend.store._common import check_bid, rank_bids
from contend.store.etcd.keys import Keys, enc, unenc
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions
from contend.store.etcd.txn import WRITE_RETRIES, absent, delete, get, mod_is, put, value_is
from contend.store.port import Auction


class Auctions:
    def __init__(
        self, etcd: Etcd, keys: Keys, clock: Callable[[], float], sessions: Sessions
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self._sessions = sessions

    async def bid(
        self, expert: str, session: str, task_id: str, score: float, window: float
    ) -> Auction:
        score, window = check_bid(score, window)
        k = self._keys.k
        tkey, ukey = self._keys.task(task_id), k("u", enc(task_id))
        bids_prefix = k("b", enc(task_id), "")
        mine = k("b", enc(task_id), enc(expert))
        for _ in range(WRITE_RETRIES):
            _, session_value = await self._sessions.check(expert, session)
            reads = await self._etcd.reads([get(tkey), get(ukey), get(bids_prefix, prefix=True)])
            t, u, bids = (r.kvs for r in reads)
            now = self._clock()
            if not t:
                raise TaskNotFound(task_id)
            closes = json.loads(u[0].value)["closes_at"] if u else now + window
            if Record.loads(t[0].value).state != TaskState.PENDING:
                return Auction(task_id, now, closes if u else now, (), open=False)
            placed = {
                unenc(kv.key[len(bids_prefix) :].decode()): json.loads(kv.value) for kv in bids
            }
            old = placed.get(expert)
            placed[expert] = {"score": score, "at": old["at"] if old else now}
            cmp = [
                mod_is(tkey, t[0].mod_revision),
                value_is(k("l", enc(expert)), session_value),
                mod_is(ukey, u[0].mod_revision) if u else absent(ukey),
            ]
            ops = [] if u else [put(ukey, json.dumps({"closes_at": closes}))]
            if old is None or old["score"] != score:
                ops.append(put(mine, json.dumps(placed[expert])))
            if (await self._etcd.txn(cmp, ops)).succeeded:
                ranked = rank_bids({e: (b["score"], b["at"]) for e, b in placed.items()})
                return Auction(task_id, now, closes, ranked)
        raise StoreError(f"the auction of task {task_id} kept changing; gave up")

    async def clear(self) -> None:
        """Drop the auctions and bids of tasks that are no longer pending."""
        etcd, k = self._etcd, self._keys.k
        base = len(k("u", ""))
        tids = [unenc(kv.key[base:].decode()) for kv in await etcd.scan(k("u", ""), keys_only=True)]
        if not tids:
            return
        recs = await etcd.read_many([self._keys.task(t) for t in tids])
        for tid, kv in zip(tids, recs, strict=True):
            if kv is None or Record.loads(kv.value).state != TaskState.PENDING:
                cmp = [] if kv is None else [mod_is(kv.key, kv.mod_revision)]
                await etcd.txn(
                    cmp,
                    [delete(k("u", enc(tid))), delete(k("b", enc(tid), ""), prefix=True)],
                )
