"""expire(), which every expert runs after each heartbeat: it returns the tasks of ended
sessions to pending (or dead), settles endings whose waiters were not told, drops empty
priority levels, closed auctions and experts long gone, and compacts etcd's history."""

from __future__ import annotations

import asyncio
import collections
import json
import math
from collections.abc import Callable

from aetcd import rpc

from contend.domain import transitions as rules
from contend.domain.task import OWNED_STATES
from contend.errors import StoreError
from contend.store.etcd.auctions import Auctions
from contend.store.etcd.dependants import Dependants
from contend.store.etcd.keys import Keys, enc, prefix_end, unenc
from contend.store.etcd.outcomes import apply_outcome
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions
from contend.store.etcd.txn import absent, delete, get, mod_is, put

#: expire() looks for priority levels left empty this often (seconds, store clock).
LEVEL_SWEEP = 60.0
#: Expert records whose session ended this long ago are removed by expire().
EXPERT_RETENTION = 3600.0


class Housekeeping:
    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        clock: Callable[[], float],
        compact_after: float,
        sessions: Sessions,
        dependants: Dependants,
        auctions: Auctions,
        touch: Callable[[], None],
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self.compact_after = compact_after
        self._sessions = sessions
        self._dependants = dependants
        self._auctions = auctions
        self._touch = touch
        self._seen_revisions: collections.deque[tuple[float, int]] = collections.deque()
        self._compacted = 0  # the revision this instance last compacted to
        self._swept_at = -math.inf
        self._forgot_at = -math.inf

    async def expire(self) -> int:
        ended: list[str] = []  # tasks that died with waiters to tell
        moved = 0
        for marker, session, lapsed in await self._ended_sessions():
            settled = True
            for i in range(0, len(lapsed), 64):  # an expert that held many tasks died: in parallel
                got = await asyncio.gather(
                    *(self._return(t, k, session, ended) for t, k in lapsed[i : i + 64])
                )
                moved += sum(m for m, _ in got)
                settled = settled and all(s for _, s in got)
            if settled:  # every claim of the session is dealt with: forget the session
                await self._etcd.txn([], [delete(marker)])
        await self._dependants.settle_many(ended)
        # Repair: endings whose waiters were not settled (a crash right after the ending).
        leftovers = await self._dependants.leftovers()
        await self._dependants.settle_many([t for t in leftovers if t not in ended])
        await self._sweep_levels()
        await self._auctions.clear()
        await self._forget_experts()
        await self._compact_old_history()
        if moved:
            self._touch()
        return moved

    async def end_session(self, expert: str, session: str) -> int:
        """End *expert*'s *session* (the lease revoked: every write of it is fenced out from
        that moment) and return at once, as expire() would later, every claim the expert's
        name holds: this session's, and any an earlier session of the name left behind."""
        if not await self._sessions.end(expert, session):
            return 0
        k = self._keys.k
        abase = k("a", enc(expert), "")
        held = [
            (unenc(akv.key[len(abase) :].decode()), akv.key, akv.value.decode().partition(" ")[2])
            for akv in await self._etcd.scan(abase)
        ]
        ended: list[str] = []
        got = await asyncio.gather(
            *(self._return(t, a, held_by, ended, session_ended=True) for t, a, held_by in held)
        )
        if all(settled for (_, settled), (_, _, s) in zip(got, held, strict=True) if s == session):
            await self._etcd.txn([], [delete(k("x", enc(expert), session))])
        await self._dependants.settle_many(ended)
        self._touch()
        return sum(moved for moved, _ in got)

    async def _return(
        self,
        tid: str,
        akey: bytes,
        session: str,
        ended: list[str],
        *,
        session_ended: bool = False,
    ) -> tuple[bool, bool]:
        """Return one task of an ended session to pending (or dead): (moved, settled),
        settled meaning that its a/ key is gone. A task that died with waiters joins
        *ended*."""
        etcd, keys = self._etcd, self._keys
        tkey = keys.task(tid)
        t = (await etcd.read_many([tkey]))[0]
        if t is None:
            await etcd.txn([], [delete(akey)])
            return False, True
        rec = Record.loads(t.value)
        if rec.state not in OWNED_STATES or rec.session != session:
            done = await etcd.txn([mod_is(tkey, t.mod_revision)], [delete(akey)])
            return False, bool(done.succeeded)
        now = self._clock()
        prev = rec.owner
        outcome = rules.expired(prev, rec.attempts, rec.max_attempts, session_ended=session_ended)
        # The outcome ends the ownership (the owner's a/ key); the a/ key found goes too when
        # it is another one. The session has ended for good (a new one has another id), so
        # the task as read is all there is to compare.
        ops = [] if prev is not None and keys.held(prev, tid) == akey else [delete(akey)]
        ops += apply_outcome(keys, rec, outcome, now)
        ops.append(put(tkey, rec.dumps()))
        resp = await etcd.txn([mod_is(tkey, t.mod_revision)], ops)
        if resp.succeeded and outcome.ends and rec.has_waiters:
            ended.append(tid)
        return bool(resp.succeeded), bool(resp.succeeded)

    async def _ended_sessions(self) -> list[tuple[bytes, str, list[tuple[str, bytes]]]]:
        """(marker key, session, [(task id, a/ key)]) of each session that has ended with its
        marker still there: the claims it held. Sessions are found from their x/ markers and
        the live l/ keys, read at one revision (a session's l/ key and marker are written
        together); only the a/ keys of an ended session's expert are read, not every claim of
        every expert with the deleted ones etcd keeps until compaction."""
        etcd, k = self._etcd, self._keys.k
        xbase, lbase = k("x", ""), k("l", "")
        reads = await etcd.reads([get(xbase, prefix=True, keys_only=True), get(lbase, prefix=True)])
        markers, lives = (r.kvs for r in reads)
        live = {kv.key[len(lbase) :]: json.loads(kv.value)["session"] for kv in lives}
        out = []
        for kv in markers:
            expert, _, session = kv.key[len(xbase) :].decode().partition("/")
            if live.get(expert.encode()) == session:
                continue
            held = []
            abase = k("a", expert, "")
            for akv in await etcd.scan(abase):
                if akv.value.decode().partition(" ")[2] == session:
                    held.append((unenc(akv.key[len(abase) :].decode()), akv.key))
            out.append((kv.key, session, held))
        return out

    async def _sweep_levels(self) -> None:
        """Drop the level keys (v/) of priority levels no pending task is at any more, so that
        claims do not read them; once a LEVEL_SWEEP (store clock). A level's tasks are counted
        from its floor after its key was read, and the key is deleted only if it has not been
        put since: a task entering the level meanwhile puts it, and the delete fails."""
        now = self._clock()
        if now - self._swept_at < LEVEL_SWEEP:
            return
        self._swept_at = now
        etcd = self._etcd
        base = self._keys.k("v", "")
        for kv in await etcd.scan(base):
            tasks = self._keys.p + b"q/" + kv.key[len(base) :] + b"/"
            if await etcd.count(tasks + kv.value, prefix_end(tasks)) == 0:
                await etcd.txn([mod_is(kv.key, kv.mod_revision)], [delete(kv.key)])

    async def _forget_experts(self) -> None:
        """Remove records of experts gone for an hour; looked at once a minute (store clock)."""
        now = self._clock()
        if now - self._forgot_at < 60:
            return
        self._forgot_at = now
        for e in await self._sessions.experts():
            if not e.alive and e.lease_deadline < now - EXPERT_RETENTION:
                await self._etcd.txn([], [delete(self._keys.k("e", enc(e.info.id)))])

    async def _compact_old_history(self) -> None:
        """Compact etcd's history to the newest revision this instance saw at least
        ``compact_after`` seconds ago (store clock), at most once per ``compact_after``.

        etcd keeps every deleted key in its index until its history is compacted, and every
        read of a range walks them (an ended session's claims, a level's keys above its floor,
        the s/ and u/ markers): without compaction those reads slow down in proportion to
        everything done so far, and etcd's database grows until its quota stops all writes.
        Compaction is of the whole cluster, not only this prefix; ``compact_after=0`` leaves
        it to the operator."""
        if not self.compact_after:
            return
        etcd = self._etcd
        now = self._clock()
        self._seen_revisions.append((now, etcd.rev))
        target = 0
        while self._seen_revisions and now - self._seen_revisions[0][0] >= self.compact_after:
            target = self._seen_revisions.popleft()[1]
        if target <= self._compacted:
            return
        self._compacted = target
        # One instance compacts per interval, not every expert: the first to move the marker.
        marker = self._keys.k("compacted")
        kv = (await etcd.read_many([marker]))[0]
        try:
            last = float(kv.value) if kv is not None else -math.inf
        except ValueError:
            last = -math.inf
        if now - last < self.compact_after:
            return
        cmp = [mod_is(marker, kv.mod_revision) if kv is not None else absent(marker)]
        if not (await etcd.txn(cmp, [put(marker, repr(now))])).succeeded:
            return
        req = rpc.CompactionRequest(revision=target, physical=False)
        try:
            await etcd.call("a compaction", lambda: etcd.kv.Compact(req, timeout=etcd.timeout))
        except StoreError as exc:
            if "compacted" not in str(exc):  # compacted past it by someone else: fine
                raise
