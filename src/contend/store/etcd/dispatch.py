"""Central queues on etcd: leaderships, assignments under a term, the leader's read, and the
central tasks a claim takes first.

The rules are ``contend.domain.dispatch``'s; each write here reads what they need, decides,
and lands only under compares that what it read still holds (else it reads again):

* ``leader/{name}``, a leadership, ``{"holder", "session", "term", "deadline"}``: taken or renewed
  under a compare of its mod_revision (or its absence) and of the new holder's session key.
  The holder's session is live while its ``l/{expert}`` key (on the session's lease) names
  it: when the session ends, its lease goes and the leadership is free at once. The key
  itself is on no lease, so that the term outlives every holder and only ever grows.
* An assignment compares the leadership key's mod_revision and the holder's session key as
  read (so the term, holder and session are the ones checked) and each task record's, so a
  task claimed or cancelled meanwhile is not given; a task given to an expert that is gone
  is given again only while that expert's session key is still absent.
* A pending central task's index key is out of the priority index (keys.py): under
  ``z/{queue}/u/`` until a leader gives it, under ``z/{queue}/a/{expert}/`` once given. A
  compete claim never reads z/, so a central backlog costs it nothing; an expert's claim
  reads its own ``a/`` prefix (the few tasks given to it) and tries those first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from contend.domain import dispatch as rules
from contend.domain.scoring import TaskView
from contend.domain.task import OWNED_STATES, Capabilities, Requirements, TaskState, aged_priority
from contend.errors import StoreError
from contend.store._common import check_limit, check_ttl, session_not_live
from contend.store.etcd.candidates import Rank, runnable_now
from contend.store.etcd.keys import PRIORITY_BASE, Keys, micros, prefix_end, unenc
from contend.store.etcd.ownership import parse_held
from contend.store.etcd.record import Record, index_json, index_limit_key, index_value
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import WRITE_RETRIES, Op, absent, delete, get, mod_is, put, value_is
from contend.store.port import CentralBacklog

#: The most priority levels of a central queue one leader's read goes through.
BACKLOG_LEVELS = 16
#: A central index entry as read: (its rank, task id, queue, priority, index value).
Entry = tuple[Rank, str, str, int, bytes]


def entry(base: bytes, kv: Any, queue: str, now: float) -> tuple[Entry, int]:
    """A central index key under *base* (``{inv}/{due}/{task}`` after it) as ranked for
    claims (candidates.rank_of), and its due time in microseconds."""
    inv, due, tid = kv.key[len(base) :].decode().split("/")
    tid = unenc(tid) if "%" in tid else tid
    priority = PRIORITY_BASE - int(inv)
    rank = (-aged_priority(priority, now - int(due) / 1e6), due, tid)
    return (rank, tid, queue, priority, bytes(kv.value)), int(due)


def view_of(e: Entry) -> TaskView:
    _, tid, queue, priority, value = e
    parsed = index_json(value)
    created = float(value[: value.index(b" ")])
    req = Requirements.from_json(parsed["req"])
    return TaskView(tid, str(parsed["type"]), queue, priority, req, created)


def given_reads(keys: Keys, expert: str, queues: Sequence[str]) -> list[Op]:
    """The reads :func:`given` takes: *expert*'s own ``a/`` prefix of each queue, a few keys
    each (a claim sends them with its session check: no round trip more)."""
    return [get(keys.assigned(q, expert), prefix=True) for q in dict.fromkeys(queues)]


def given(
    keys: Keys,
    expert: str,
    queues: Sequence[str],
    reads: Sequence[Any],
    caps: Capabilities,
    now: float,
    types: Collection[str] | None,
    keyed: dict[str, str],
) -> list[str]:
    """Ids of the central tasks given to *expert* in *queues* that it may claim now (due, of
    *types*, their requirements met), in claim order, from *reads* (the RangeResponses of
    :func:`given_reads`). *keyed* receives the limit key of those that have one."""
    qs = list(dict.fromkeys(queues))
    keep = runnable_now(caps, micros(now), types)
    found: list[Entry] = []
    for q, resp in zip(qs, reads, strict=True):
        base = keys.assigned(q, expert)
        for kv in resp.kvs:
            if keep(kv):
                e, _ = entry(base, kv, q, now)
                found.append(e)
                lim = index_limit_key(kv.value)
                if lim is not None:
                    keyed[e[1]] = lim
    found.sort()
    return [e[1] for e in found]


def _leadership(name: str, kv: Any) -> rules.Leadership | None:
    if kv is None:
        return None
    d = json.loads(kv.value)
    return rules.Leadership(name, d["holder"], d["session"], int(d["term"]), float(d["deadline"]))


class Dispatch:
    """The central queues of one store instance: ``lead``, ``assign``, ``central_backlog``."""

    def __init__(
        self, etcd: Etcd, keys: Keys, clock: Callable[[], float], touch: Callable[[], None]
    ) -> None:
        self._etcd = etcd
        self._keys = keys
        self._clock = clock
        self._touch = touch

    async def _holder(self, current: rules.Leadership | None, known: Mapping[str, Any]) -> Any:
        """The holder's session key (``l/{holder}``) if it names the holder's session now,
        else None: the holder's session is not live."""
        if current is None or current.holder is None:
            return None
        if current.holder in known:
            kv = known[current.holder]
        else:
            kv = (await self._etcd.read_many([self._keys.session(current.holder)]))[0]
        if kv is None or json.loads(kv.value)["session"] != current.session:
            return None
        return kv

    async def lead(self, expert: str, session: str, name: str, ttl: float) -> int | None:
        ttl = check_ttl(ttl)
        lkey, own = self._keys.leadership(name), self._keys.session(expert)
        for _ in range(WRITE_RETRIES):
            mine, lkv = await self._etcd.read_many([own, lkey])
            if mine is None or json.loads(mine.value)["session"] != session:
                raise session_not_live(expert, session)
            current = _leadership(name, lkv)
            holder = await self._holder(current, {expert: mine})
            now = self._clock()
            granted = rules.decide_lead(
                current, expert, session, now, ttl, holder_live=holder is not None
            )
            if granted is None:
                return None
            value = {"holder": expert, "session": session, "term": granted.term}
            value["deadline"] = granted.deadline
            resp = await self._etcd.txn(
                [
                    value_is(own, mine.value),
                    absent(lkey) if lkv is None else mod_is(lkey, lkv.mod_revision),
                ],
                [put(lkey, json.dumps(value))],
            )
            if resp.succeeded:
                return granted.term
        raise StoreError(f"leadership {name!r}: kept conflicting; gave up after retries")

    async def assign(
        self, expert: str, session: str, name: str, term: int, assignments: Mapping[str, str]
    ) -> int:
        plan = dict(assignments)
        count = 0
        for _ in range(WRITE_RETRIES):
            fixed, tries = await self._plan(expert, session, name, term, plan)
            landed: list[str] = []
            if tries:
                landed = await self._give(fixed, tries)
                for tid in landed:
                    plan.pop(tid)
                count += len(landed)
            if len(landed) == len(tries):
                if count:
                    self._touch()
                return count
        raise StoreError(f"leadership {name!r}: assignments kept conflicting; gave up")

    async def _plan(
        self, expert: str, session: str, name: str, term: int, plan: Mapping[str, str]
    ) -> tuple[list[Op], list[tuple[str, list[Op], list[Op]]]]:
        """Read the leadership and the tasks of *plan*: raise NotLeader when *expert* may not
        assign; else the compares every Txn of the assignment carries (the leadership and
        its holder as read), and (task id, compares, operations) of each task to give."""
        etcd, keys = self._etcd, self._keys
        lkey = keys.leadership(name)
        lkv = (await etcd.read_many([lkey]))[0]
        current = _leadership(name, lkv)
        holder = await self._holder(current, {})
        now = self._clock()
        refused = rules.assign_refusal(
            name, current, expert, session, term, now, holder_live=holder is not None
        )
        if refused is not None:
            raise refused
        if not plan:
            return [], []
        assert lkv is not None and current is not None and current.holder is not None
        fixed = [mod_is(lkey, lkv.mod_revision), value_is(holder.key, holder.value)]
        ids = list(plan)
        kvs = await etcd.read_many([keys.task(t) for t in ids])
        recs = {
            tid: (kv, rec)
            for tid, kv in zip(ids, kvs, strict=True)
            if kv is not None
            and (rec := Record.loads(kv.value)).central
            and rec.indexed
            and rec.state == TaskState.PENDING
        }
        olds = sorted({r.assignee for _, r in recs.values() if r.assignee is not None})
        lives = await etcd.read_many([self._keys.session(a) for a in olds])
        gone = {a for a, kv in zip(olds, lives, strict=True) if kv is None}
        detail = rules.assigned_detail(expert, term)
        tries = []
        for tid, (kv, rec) in recs.items():
            old = rec.assignee
            if old is not None and old not in gone:
                continue  # still its live assignee's
            cmp = [mod_is(kv.key, kv.mod_revision)]
            if old is not None:
                cmp.append(absent(self._keys.session(old)))  # and it is not back meanwhile
            ops = [delete(keys.central(rec))]
            rec.assignee = plan[tid]
            rec.event(now, rules.ASSIGNED, rec.assignee, detail)
            ops += [put(keys.central(rec), index_value(rec)), put(kv.key, rec.dumps())]
            tries.append((tid, cmp, ops))
        return fixed, tries

    async def _give(
        self, fixed: list[Op], tries: Sequence[tuple[str, list[Op], list[Op]]]
    ) -> list[str]:
        """Commit the assignments *tries*, in as few Txns as ``max_txn_ops`` allows (one for
        a plan of up to a third of it), each under the *fixed* compares; the ids that landed.
        A Txn that fails lands nothing: the caller reads again."""
        room = self._etcd.max_ops
        groups: list[list[tuple[str, list[Op], list[Op]]]] = [[]]
        n_cmp, n_ops = len(fixed), 0
        for t in tries:
            if groups[-1] and (n_cmp + len(t[1]) > room or n_ops + len(t[2]) > room):
                groups.append([])
                n_cmp, n_ops = len(fixed), 0
            groups[-1].append(t)
            n_cmp, n_ops = n_cmp + len(t[1]), n_ops + len(t[2])
        landed: list[str] = []
        for group in groups:
            cmp = list(dict.fromkeys([*fixed, *(c for _, cs, _ in group for c in cs)]))
            resp = await self._etcd.commit(cmp, [op for _, _, ops in group for op in ops])
            if resp is not None and not resp.succeeded:
                break
            landed += [tid for tid, _, _ in group]
        return landed

    async def central_backlog(
        self, queues: Sequence[str], live: Collection[str], limit: int
    ) -> CentralBacklog:
        check_limit(limit)
        qs = list(dict.fromkeys(queues))
        alive = sorted(set(live))
        keys, etcd = self._keys, self._etcd
        if not qs:
            return CentralBacklog([], {})
        reads = await etcd.reads([get(keys.assigned(q), prefix=True) for q in qs])
        now = self._clock()
        now_us = micros(now)
        assigned: dict[str, int] = {}
        need: list[Entry] = []
        known = set(alive)
        for q, resp in zip(qs, reads, strict=True):
            base = keys.assigned(q)
            for kv in resp.kvs:
                who_enc, _, _ = kv.key[len(base) :].partition(b"/")
                who = unenc(who_enc.decode())
                if who in known:
                    assigned[who] = assigned.get(who, 0) + 1
                    continue
                e, due = entry(base + who_enc + b"/", kv, q, now)
                if due <= now_us:
                    need.append(e)
        for q in qs:
            need += await self._unassigned(q, now, limit)
        need.sort()
        return CentralBacklog([view_of(e) for e in need[:limit]], assigned, await self._held(alive))

    async def _held(self, experts: Sequence[str]) -> dict[str, int]:
        """{expert: tasks it holds}: the records of the tasks its ownership keys list
        (ownership.py), counted where they name it in an owned state."""
        etcd, keys = self._etcd, self._keys
        lists: list[Any] = []
        for i in range(0, len(experts), etcd.max_ops):
            chunk = experts[i : i + etcd.max_ops]
            lists += await etcd.reads([get(keys.batches(e), prefix=True) for e in chunk])
        # a task stolen, or claimed again by another, is listed under each of them
        pairs = dict.fromkeys(
            (tid, e)
            for e, resp in zip(experts, lists, strict=True)
            for tid, _, _ in parse_held(keys, e, resp.kvs)
        )
        tids = list(dict.fromkeys(tid for tid, _ in pairs))
        kvs = await etcd.read_many([keys.task(t) for t in tids])
        owners = {
            tid: rec.owner
            for tid, kv in zip(tids, kvs, strict=True)
            if kv is not None and (rec := Record.loads(kv.value)).state in OWNED_STATES
        }
        held: dict[str, int] = {}
        for tid, e in pairs:
            if owners.get(tid) == e:
                held[e] = held.get(e, 0) + 1
        return held

    async def _unassigned(self, queue: str, now: float, limit: int) -> list[Entry]:
        """The due unassigned tasks of *queue*, up to *limit* of each priority level (the
        first in key order: due time, then id), from up to BACKLOG_LEVELS levels, best
        first."""
        base = self._keys.unassigned(queue)
        end = prefix_end(base)
        now_us = micros(now)
        lo = base
        out: list[Entry] = []
        for _ in range(BACKLOG_LEVELS):
            resp = await self._etcd.range(lo, end, limit=limit)
            per: dict[bytes, int] = {}
            for kv in resp.kvs:
                level = kv.key[len(base) : len(base) + 8]
                per[level] = per.get(level, 0) + 1
                e, due = entry(base, kv, queue, now)
                if due <= now_us:
                    out.append(e)
            if not resp.more or not resp.kvs:
                break
            last = resp.kvs[-1].key
            level = last[len(base) : len(base) + 8]
            # the last level read: on from where it stopped, or past it once it gave enough
            lo = last + b"\0" if per[level] < limit else prefix_end(base + level + b"/")
        return out
