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
from contend.store.etcd.ownership import parse_held, parse_legacy
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions
from contend.store.etcd.txn import absent, delete, get, mod_is, put

#: expire() looks for priority levels left empty this often (seconds, store clock).
LEVEL_SWEEP = 60.0
#: Expert records whose session ended this long ago are removed by expire().
EXPERT_RETENTION = 3600.0
#: (task, session, ownership key) of a task an ownership key lists.
Held = tuple[str, str, bytes]


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
        for marker, lapsed in await self._ended_sessions():
            n, done = await self._return_all(lapsed, ended)
            moved += n
            if all(done.values()):  # every claim of the session is dealt with: forget the session
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
        held = await self._held_by(expert)
        ended: list[str] = []
        moved, done = await self._return_all(held, ended, session_ended=True)
        if all(ok for (_, s), ok in done.items() if s == session):
            await self._etcd.txn([], [delete(self._keys.k("x", enc(expert), session))])
        await self._dependants.settle_many(ended)
        self._touch()
        return moved

    async def _held_by(self, expert: str, session: str | None = None) -> list[Held]:
        """(task, session, ownership key) of each task *expert*'s ownership keys list (of
        *session* only, when given): the batch keys, and schema 5's a/ keys an upgraded store
        may keep of a session that ended before the upgrade."""
        keys = self._keys
        batches, legacy = await asyncio.gather(
            self._etcd.scan(keys.batches(expert, session)),
            self._etcd.scan(keys.legacy_held(expert)),
        )
        out = parse_held(keys, expert, batches) + parse_legacy(keys, expert, legacy)
        return out if session is None else [h for h in out if h[1] == session]

    async def _return_all(
        self, held: list[Held], ended: list[str], *, session_ended: bool = False
    ) -> tuple[int, dict[tuple[str, str], bool]]:
        """Return the tasks *held* lists that their session still holds, and delete the
        ownership keys whose tasks are all dealt with: (tasks moved, {(task, session):
        whether the session no longer holds it})."""
        pairs = list(dict.fromkeys((tid, session) for tid, session, _ in held))
        done: dict[tuple[str, str], bool] = {}
        moved = 0
        for i in range(0, len(pairs), 64):  # an expert that held many tasks died: in parallel
            chunk = pairs[i : i + 64]
            got = await asyncio.gather(
                *(self._return(t, s, ended, session_ended=session_ended) for t, s in chunk)
            )
            moved += sum(m for m, _ in got)
            done.update(zip(chunk, (s for _, s in got), strict=True))
        keys_of: dict[bytes, bool] = {}
        for tid, session, key in held:
            keys_of[key] = keys_of.get(key, True) and done[(tid, session)]
        gone = [key for key, ok in keys_of.items() if ok]
        step = self._etcd.max_ops
        for i in range(0, len(gone), step):
            await self._etcd.txn([], [delete(k) for k in gone[i : i + step]])
        return moved, done

    async def _return(
        self, tid: str, session: str, ended: list[str], *, session_ended: bool = False
    ) -> tuple[bool, bool]:
        """Return one task of an ended session to pending (or dead), if that session still
        holds it: (moved, settled), settled meaning that the session no longer holds it. A
        task that died with waiters joins *ended*."""
        etcd, keys = self._etcd, self._keys
        tkey = keys.task(tid)
        t = (await etcd.read_many([tkey]))[0]
        if t is None:
            return False, True
        rec = Record.loads(t.value)
        if rec.state not in OWNED_STATES or rec.session != session:
            return False, True
        now = self._clock()
        outcome = rules.expired(
            rec.owner, rec.attempts, rec.max_attempts, session_ended=session_ended
        )
        # The session has ended for good (a new one has another id), so the task as read is
        # all there is to compare.
        ops = apply_outcome(keys, rec, outcome, now)
        ops.append(put(tkey, rec.dumps()))
        resp = await etcd.txn([mod_is(tkey, t.mod_revision)], ops)
        if resp.succeeded and outcome.ends and rec.has_waiters:
            ended.append(tid)
        return bool(resp.succeeded), bool(resp.succeeded)

    async def _ended_sessions(self) -> list[tuple[bytes, list[Held]]]:
        """(marker key, [(task, session, ownership key)]) of each session that has
        ended with its marker still there: the claims it held. Sessions are found from their
        x/ markers and the live l/ keys, read at one revision (a session's l/ key and marker
        are written together); only the ownership keys of an ended session's expert are read,
        not every claim of every expert with the deleted ones etcd keeps until
        compaction."""
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
            held = await self._held_by(unenc(expert), session)
            out.append((kv.key, held))
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
