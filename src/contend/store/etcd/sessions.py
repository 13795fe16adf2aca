"""Experts and their sessions: one etcd lease per session, granted by register(), kept alive
by renew() on a long-lived keep-alive stream, revoked by deregister().

Keys: ``e/{expert}`` the expert's record (info, session, counters; it outlives the session),
``l/{expert}`` the live session on the expert's lease, ``x/{expert}/{session}`` a marker of a
session that may hold claims (expire() deletes it once the session ended and its tasks are
returned). The store never keeps a lease alive on its own: the expert's heartbeat is the
liveness signal, so a stalled expert loses its lease.

The ``l/`` key is the only key on a lease: an owner write compares it, so a task's claim
lapses with its owner's session, with no key of its own on the lease (schema 4 had a claim
key ``c/{task}`` there; attaching and detaching it cost etcd a third of its CPU per task).
What a session holds, renew() reads from the records of the tasks this instance claimed for
it (``Claimed``); the ownership keys of those found no longer held go then, when no write
deleted them (ownership.py). A claim through another instance than the one that registered
the session (two store objects in one test; never an expert) first marks the session's x/
key ``foreign``, and renew() of such a session reads its ownership keys instead."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from aetcd import rpc

from contend.domain.task import OWNED_STATES
from contend.errors import LeaseLost, SchemaError, StoreError
from contend.store._common import check_ttl, live_elsewhere, session_not_live
from contend.store.etcd.keys import Keys, enc
from contend.store.etcd.ownership import Batches, parse_held
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import Op, absent, delete, get, put, value_is
from contend.store.port import ExpertInfo, ExpertRecord, Heartbeat

#: The x/ marker of a session some other instance than its own claimed for.
FOREIGN = b"foreign"

#: How many sessions' lease ids and records one store instance keeps cached.
SESSION_CACHE = 256


def session_deadline(record: dict[str, Any]) -> float:
    """When an expert record's session ends: its last heartbeat plus the TTL, or earlier when
    it was deregistered."""
    deadline = float(record["heartbeat_at"] + record["ttl"])
    ended_at = record.get("ended_at")
    return deadline if ended_at is None else min(deadline, float(ended_at))


class Claimed:
    """The tasks each session registered by this instance claimed (or stole) through it and
    has not ended through it: what renew() reads to say what the session holds. A task
    moved by someone else (stolen, cancelled, expired) leaves at the next renew()."""

    def __init__(self) -> None:
        self._session_of: dict[str, str] = {}
        self._tasks: dict[str, dict[str, None]] = {}

    def opened(self, session: str) -> None:
        self._tasks.setdefault(session, {})

    def add(self, session: str, tids: Sequence[str]) -> None:
        tasks = self._tasks.get(session)
        if tasks is None:
            return  # a session of another instance: renew() there scans its ownership keys
        for tid in tids:
            old = self._session_of.get(tid)
            if old is not None and old != session:
                self._tasks.get(old, {}).pop(tid, None)
            self._session_of[tid] = session
            tasks[tid] = None

    def forget(self, tid: str) -> None:
        session = self._session_of.pop(tid, None)
        if session is not None:
            self._tasks.get(session, {}).pop(tid, None)

    def knows(self, session: str) -> bool:
        """Whether *session* was registered here."""
        return session in self._tasks

    def of(self, session: str) -> list[str] | None:
        """The tasks *session* may hold, or None for a session not registered here."""
        tasks = self._tasks.get(session)
        return None if tasks is None else list(tasks)

    def drop(self, session: str) -> None:
        for tid in self._tasks.pop(session, {}):
            self._session_of.pop(tid, None)


class Sessions:
    """The sessions of experts, with a bounded cache of the live ones this instance knows:
    session -> (lease id, ``l/`` value), the keep-alive stream of each lease, and the expert
    record as this instance last put it."""

    def __init__(self, etcd: Etcd, keys: Keys, clock: Callable[[], float]) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self.cache: dict[str, tuple[int, bytes]] = {}  # session -> (lease id, l/ value)
        self.keepalives: dict[int, KeepAlive] = {}
        self.records: dict[str, dict[str, Any]] = {}  # session -> its expert record, as put
        self.claimed = Claimed()
        self.batches = Batches()
        self._marked: set[str] = set()  # sessions of other instances marked foreign

    async def check(self, expert: str, session: str) -> tuple[int, bytes]:
        """(lease id, session key value) of a live session; raises LeaseLost."""
        lease, value, _ = await self.check_with(expert, session, ())
        return lease, value

    async def check_with(
        self, expert: str, session: str, reads: Sequence[Op]
    ) -> tuple[int, bytes, list[Any]]:
        """:meth:`check`, and the RangeResponses of *reads* (GET operations): one read-only
        Txn where the server's are safe (``Etcd.read_txns``), else the reads at once beside
        the session's, so that they never cost a round trip of their own."""
        own = get(self._keys.session(expert))
        etcd = self._etcd
        if etcd.read_txns or not reads:
            got = await etcd.reads([own, *reads])
        else:
            first, rest = await asyncio.gather(etcd.reads([own]), etcd.reads(reads))
            got = [*first, *rest]
        kv = got[0].kvs[0] if got[0].kvs else None
        if kv is None or json.loads(kv.value)["session"] != session:
            self.cache.pop(session, None)
            raise session_not_live(expert, session)
        lease = int(json.loads(kv.value)["lease"])
        self.remember(session, lease, kv.value)
        return lease, kv.value, got[1:]

    def remember(self, session: str, lease: int, value: bytes) -> None:
        """Cache a live session's lease (etcd has the truth); keep the newest sessions only."""
        self.cache[session] = (lease, value)
        while len(self.cache) > SESSION_CACHE:
            oldest = next(iter(self.cache))
            self.drop(oldest, self.cache[oldest][0])

    def drop(self, session: str, lease: int) -> None:
        """Forget a session and close its keep-alive stream."""
        self.cache.pop(session, None)
        self.records.pop(session, None)
        self.claimed.drop(session)
        self.batches.drop(session)
        self._marked.discard(session)
        ka = self.keepalives.pop(lease, None)
        if ka is not None:
            ka.close()

    def close(self) -> None:
        for ka in list(self.keepalives.values()):
            ka.close()
        self.keepalives.clear()

    async def register(self, info: ExpertInfo, lease_ttl: float) -> str:
        ttl = max(1, math.ceil(check_ttl(lease_ttl)))
        etcd = self._etcd
        grant = await etcd.call(
            "a lease grant",
            lambda: etcd.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl), timeout=etcd.timeout),
        )
        if grant.error:
            raise StoreError(f"{etcd.where()} refused a lease: {grant.error}")
        lease = int(grant.ID)
        granted = int(grant.TTL)
        session = uuid.uuid4().hex
        now = self._clock()
        k = self._keys.k
        lkey, ekey = self._keys.session(info.id), k("e", enc(info.id))
        lvalue = json.dumps({"session": session, "lease": lease, "ttl": granted}).encode()
        old = (await etcd.read_many([ekey]))[0]
        ended: dict[str, float] = {}
        if old is not None:
            # Remember when the last sessions ended: their unexpired claims report it.
            o = json.loads(old.value)
            ended = dict(list(o.get("ended", {}).items())[-3:])
            ended[o["session"]] = session_deadline(o)
        record = {
            "info": info.to_json_text(),
            "session": session,
            "lease": lease,
            "ttl": granted,
            "started_at": now,
            "heartbeat_at": now,
            "ended_at": None,
            "ended": ended,
            "load": 0,
            "claim_attempts": 0,
            "claims_won": 0,
            "tasks_done": 0,
        }
        try:
            resp = await etcd.txn(
                [absent(lkey)],
                [
                    put(lkey, lvalue, lease),
                    put(ekey, json.dumps(record)),
                    put(k("x", enc(info.id), session), b""),
                ],
                [get(ekey)],
            )
        except SchemaError:
            await self.revoke(lease)  # the store is gone: leave nothing of this one in etcd
            raise
        if not resp.succeeded:
            await self.revoke(lease)
            kvs = resp.responses[0].response_range.kvs
            other = ExpertInfo.from_json_text(json.loads(kvs[0].value)["info"]) if kvs else info
            raise live_elsewhere(info.id, other.host, other.pid)
        self.remember(session, lease, lvalue)
        self.records[session] = record
        self.claimed.opened(session)
        return session

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        """One keep-alive of the session's lease and a fresh expert record; what it holds."""
        check_ttl(lease_ttl)
        lease, session_value = self.cache.get(session) or await self.check(expert, session)
        ka = self.keepalives.get(lease)
        if ka is None:
            ka = self.keepalives[lease] = KeepAlive(self._etcd, lease)
        remaining = await ka.refresh()
        if remaining <= 0:
            self.drop(session, lease)
            raise LeaseLost(f"expert {expert}: the etcd lease of session {session} expired")
        now = self._clock()
        k = self._keys.k
        ekey, lkey = k("e", enc(expert)), self._keys.session(expert)
        d = self.records.get(session)
        if d is None:
            e = (await self._etcd.read_many([ekey]))[0]
            if e is None:
                self.drop(session, lease)
                raise LeaseLost(f"expert {expert}: its record is gone")
            d = json.loads(e.value)
        d.update(
            heartbeat_at=now,
            load=beat.load,
            claim_attempts=beat.claim_attempts,
            claims_won=beat.claims_won,
            tasks_done=beat.tasks_done,
            metrics=dict(beat.metrics),
        )
        resp = await self._etcd.txn(
            [value_is(lkey, session_value)],
            [put(ekey, json.dumps(d)), get(k("x", enc(expert), session))],
        )
        if not resp.succeeded:
            self.drop(session, lease)
            raise session_not_live(expert, session)
        self.records[session] = d
        marker = resp.responses[1].response_range.kvs
        return await self.held(expert, session, bool(marker) and marker[0].value == FOREIGN)

    async def mark_foreign(self, expert: str, session: str, value: bytes) -> None:
        """Before this instance claims for a session another one registered: mark it, so that
        renew() there reads every claim of the session, not only its own."""
        if self.claimed.knows(session) or session in self._marked:
            return
        k = self._keys.k
        await self._etcd.txn(
            [value_is(self._keys.session(expert), value)],
            [put(k("x", enc(expert), session), FOREIGN)],
        )
        self._marked.add(session)

    async def held(self, expert: str, session: str, foreign: bool = False) -> dict[str, int]:
        """{task: fence} of what *session* holds: the records of the tasks this instance
        claimed for it, or (a session registered elsewhere, or *foreign*: claimed for by
        another instance too) of those its ownership keys name. The ownership keys left
        with no task held go."""
        tids = self.claimed.of(session)
        if tids is None or foreign:
            kvs = await self._etcd.scan(self._keys.batches(expert, session))
            tids = list(dict.fromkeys(t for t, _, _ in parse_held(self._keys, expert, kvs)))
        kvs = await self._etcd.read_many([self._keys.task(t) for t in tids])
        held: dict[str, int] = {}
        for tid, kv in zip(tids, kvs, strict=True):
            rec = None if kv is None else Record.loads(kv.value)
            if (
                rec is not None
                and rec.session == session
                and rec.owner == expert
                and rec.state in OWNED_STATES
            ):
                held[tid] = rec.fence
            else:
                self.claimed.forget(tid)
                self.batches.left(tid, math.inf if rec is None else rec.fence)
        empty = list(self.batches.empty)
        if empty:
            await self._etcd.txn([], [delete(k) for k in empty[: self._etcd.max_ops]])
            self.batches.deleted(empty[: self._etcd.max_ops])
        return held

    async def revoke(self, lease: int) -> None:
        etcd = self._etcd
        try:
            await etcd.call(
                "a lease revoke",
                lambda: etcd.lease.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=lease), timeout=etcd.timeout
                ),
            )
        except StoreError as exc:
            if "not found" not in str(exc):
                raise

    async def deregister(self, expert: str, session: str) -> None:
        lkv = (await self._etcd.read_many([self._keys.session(expert)]))[0]
        if lkv is None or json.loads(lkv.value)["session"] != session:
            return
        await self._end(expert, lkv)

    async def _end(self, expert: str, lkv: Any) -> None:
        """End the live session whose ``l/`` key is *lkv*: its record says when, and its
        lease is revoked (its session key goes with it, which fences its claims out)."""
        k = self._keys.k
        lkey, ekey = self._keys.session(expert), k("e", enc(expert))
        ekv = (await self._etcd.read_many([ekey]))[0]
        if ekv is not None:
            d = json.loads(ekv.value)
            d.update(load=0, ended_at=self._clock() - 1e-6)
            await self._etcd.txn([value_is(lkey, lkv.value)], [put(ekey, json.dumps(d))])
        value = json.loads(lkv.value)
        self.drop(value["session"], int(value["lease"]))
        await self.revoke(int(value["lease"]))

    async def end(self, expert: str, session: str) -> bool:
        """End *session* if it is *expert*'s current one (its record names it), live or
        lapsed; whether it was. The caller returns its claims."""
        k = self._keys.k
        lkv, ekv = await self._etcd.read_many([self._keys.session(expert), k("e", enc(expert))])
        if ekv is None or json.loads(ekv.value)["session"] != session:
            return False
        if lkv is not None and json.loads(lkv.value)["session"] == session:
            await self._end(expert, lkv)
        return True

    async def revoke_lease(self, expert: str) -> bool:
        """Fault injection: revoke the etcd lease of *expert*'s live session, as if it had run
        out (nothing else is written); False when it had none."""
        kv = (await self._etcd.read_many([self._keys.session(expert)]))[0]
        if kv is None:
            return False
        await self.revoke(int(json.loads(kv.value)["lease"]))
        return True

    async def experts(self) -> list[ExpertRecord]:
        """Every expert's record, live or not, by id."""
        k = self._keys.k
        reads = await self._etcd.reads([get(k("e", ""), prefix=True), get(k("l", ""), prefix=True)])
        experts, sessions = (r.kvs for r in reads)
        live = {json.loads(kv.value)["session"] for kv in sessions}
        out = []
        for kv in experts:
            d = json.loads(kv.value)
            alive = d["session"] in live
            deadline = session_deadline(d)
            out.append(
                ExpertRecord(
                    info=ExpertInfo.from_json_text(d["info"]),
                    session=d["session"],
                    alive=alive,
                    load=d["load"],
                    lease_deadline=deadline,
                    heartbeat_at=d["heartbeat_at"],
                    started_at=d["started_at"],
                    claim_attempts=d["claim_attempts"],
                    claims_won=d["claims_won"],
                    tasks_done=d["tasks_done"],
                    metrics=d.get("metrics") or {},
                )
            )
        return sorted(out, key=lambda e: e.info.id)


class KeepAlive:
    """One long-lived ``LeaseKeepAlive`` stream for one lease: each refresh() sends one request
    and reads one answer (aetcd's ``refresh()`` opens a new stream per call). The stream is
    reopened once when it broke (etcd restarted)."""

    def __init__(self, etcd: Etcd, lease: int) -> None:
        self._etcd = etcd
        self._lease = lease
        self._call: Any = None
        self._lock = asyncio.Lock()

    async def refresh(self) -> int:
        """Send one keep-alive; return the TTL etcd granted (0 when the lease is gone)."""
        etcd = self._etcd
        async with self._lock:
            for attempt in range(2):
                if self._call is None:
                    self._call = etcd.lease.LeaseKeepAlive()
                try:
                    await asyncio.wait_for(
                        self._call.write(rpc.LeaseKeepAliveRequest(ID=self._lease)),
                        etcd.timeout,
                    )
                    resp = await asyncio.wait_for(self._call.read(), etcd.timeout)
                except Exception as exc:  # a broken stream raises several kinds; reopen it
                    self.close()
                    if attempt == 1:
                        raise StoreError(
                            f"cannot renew lease {self._lease:x} at {etcd.where()}: {exc}"
                        ) from exc
                    continue
                if resp is None or not isinstance(resp, rpc.LeaseKeepAliveResponse):
                    self.close()
                    continue
                return int(resp.TTL)
        raise StoreError(f"the keep-alive stream of lease {self._lease:x} keeps closing")

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None
