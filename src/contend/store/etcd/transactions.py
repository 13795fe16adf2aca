"""A task's own transaction on the etcd store: one etcd Txn that carries the task's writes
(puts and deletes of keys of its own, outside the store's prefix) and compares, together with
the completion of the task and the compares that fence it, so that both land or neither does.

It works as etcd's software transactional memory does: ``get`` reads a key at once and makes
the commit depend on it (a compare on the ``mod_revision`` it saw, 0 for a key that was absent);
``put`` and ``delete`` wait in the transaction; ``compare_value`` and ``compare_revision`` add
compares of the task's own choosing. At ``commit`` the store reads the task and its owner's
session key (on the session's lease), checks fence, owner, state and session as every owner
write does, and sends one Txn comparing the task's revision, the session key and the task's own
compares. When it fails, the Txn's failure branch says why: the task or the session moved (the
writer is fenced out: :class:`~contend.errors.FencedOut`, or the check is made again on what
moved), or else a compare of the task's own failed: :class:`~contend.errors.TransactionConflict`,
nothing was written, run the block again (``ctx.transact()`` does).

A counter incremented exactly once::

    async with ctx.transaction() as tx:
        n = int(await tx.get("app/hits") or 0)
        tx.put("app/hits", str(n + 1))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contend.domain import transitions as rules
from contend.domain.task import JSON
from contend.errors import ConfigError, FencedOut, StoreError, TaskError, TransactionConflict
from contend.store.etcd.dependants import Dependants
from contend.store.etcd.keys import Keys
from contend.store.etcd.outcomes import apply_outcome
from contend.store.etcd.owner import Owned, check_owner
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.txn import PUT, WRITE_RETRIES, Op, delete, get, mod_is, put, value_is
from contend.store.port import Completion


class Transactions:
    """The part of the store that opens tasks' transactions."""

    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        clock: Callable[[], float],
        owned: Owned,
        dependants: Dependants,
        touch: Callable[[], None],
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.clock = clock
        self._owned = owned
        self.dependants = dependants
        self.touch = touch

    async def begin(self, expert: str, task_id: str, fence: int) -> EtcdTransaction:
        """Check the claim now, so that a stale owner does not start its writes."""
        mine = self._owned.pop(task_id, None)  # what this instance's claim wrote stands in
        if mine is not None:
            pair: tuple[Any, Any] = (mine[0], mine[1])  # the commit compares them
        else:
            t, s = await self.etcd.read_many([self.keys.task(task_id), self.keys.session(expert)])
            pair = (t, s)
        checked = check_owner(
            expert, task_id, fence, rules.WRITE_STATES, pair[0], pair[1], self.clock()
        )
        if isinstance(checked, FencedOut):
            raise checked
        return EtcdTransaction(expert, task_id, fence, _part=self, _first=pair)

    def user_key(self, key: str | bytes) -> bytes:
        """A key of the task's own, as bytes; one under the store's prefix is refused."""
        if isinstance(key, str):
            key = key.encode()
        if not isinstance(key, bytes) or not key:
            raise ConfigError(f"an etcd key is a non-empty str or bytes, not {key!r}")
        if key.startswith(self.keys.p):
            raise ConfigError(
                f"key {key!r} is under the store's prefix {self.keys.p.decode()!r}: a task's "
                "transaction writes keys of its own, outside it"
            )
        return key


@dataclass(eq=False)
class EtcdTransaction:
    """``async with ctx.transaction() as tx`` on the etcd store (see the module's docstring):
    ``await tx.get(key)``, ``tx.put(key, value)``, ``tx.delete(key)``,
    ``tx.compare_value(key, value)``, ``tx.compare_revision(key, mod_revision)``; keys and
    values are ``str`` (UTF-8) or ``bytes``. ``tx.result`` is the task's result."""

    expert: str
    task_id: str
    fence: int
    result: JSON = None
    _part: Transactions | None = field(default=None, repr=False)
    _first: tuple[Any, Any] | None = field(default=None, repr=False)
    _compares: list[Op] = field(default_factory=list, repr=False)
    _writes: dict[bytes, Op] = field(default_factory=dict, repr=False)
    _read: set[bytes] = field(default_factory=set, repr=False)

    async def get(self, key: str | bytes) -> bytes | None:
        """The value of *key* (None when absent), this transaction's own write first; the
        commit then depends on the key not changing meanwhile."""
        part = self._open()
        k = part.user_key(key)
        if k in self._writes:
            op = self._writes[k]
            return op[2] if op[0] == PUT else None
        kv = (await part.etcd.read_many([k]))[0]
        if k not in self._read:
            self._read.add(k)
            self._compares.append(mod_is(k, 0 if kv is None else kv.mod_revision))
        return None if kv is None else bytes(kv.value)

    def put(self, key: str | bytes, value: str | bytes) -> None:
        k = self._open().user_key(key)
        if not isinstance(value, str | bytes):
            raise ConfigError(f"an etcd value is str or bytes, not {type(value).__name__}")
        self._writes[k] = put(k, value)

    def delete(self, key: str | bytes) -> None:
        k = self._open().user_key(key)
        self._writes[k] = delete(k)

    def compare_value(self, key: str | bytes, value: str | bytes) -> None:
        """Commit only if *key* holds exactly *value* then."""
        k = self._open().user_key(key)
        self._compares.append(value_is(k, value.encode() if isinstance(value, str) else value))

    def compare_revision(self, key: str | bytes, mod_revision: int) -> None:
        """Commit only if *key* was last written at *mod_revision* (0: the key is absent)."""
        k = self._open().user_key(key)
        if isinstance(mod_revision, bool) or not isinstance(mod_revision, int) or mod_revision < 0:
            raise ConfigError(f"a mod_revision is an integer ≥ 0, not {mod_revision!r}")
        self._compares.append(mod_is(k, mod_revision))

    async def commit(self, completion: Completion) -> None:
        part = self._take()
        keys, etcd = part.keys, part.etcd
        tid, fence = completion.task_id, completion.fence
        tkey, skey = keys.task(tid), keys.session(self.expert)
        pair, self._first = self._first, None
        for _ in range(WRITE_RETRIES):
            t, c = pair if pair is not None else await etcd.read_many([tkey, skey])
            now = part.clock()
            checked = check_owner(self.expert, tid, fence, rules.WRITE_STATES, t, c, now)
            if isinstance(checked, FencedOut):
                raise checked
            rec = checked
            outcome = rules.completed(self.expert, completion.result_json, in_transaction=True)
            ops = apply_outcome(keys, rec, outcome, now)
            ops.append(put(tkey, rec.dumps()))
            success = [*ops, *self._writes.values()]
            compare = [mod_is(tkey, t.mod_revision), value_is(skey, c.value), *self._compares]
            if max(len(success), len(compare)) > etcd.max_ops:
                raise TaskError(
                    f"task {tid}: its transaction needs {len(success)} operations and "
                    f"{len(compare)} compares; etcd takes at most {etcd.max_ops} of each "
                    "(--max-txn-ops; the completion uses a few)"
                )
            resp = await etcd.commit(compare, success, [get(tkey), get(skey)])
            if resp is None or resp.succeeded:
                break
            t2, c2 = (
                r.response_range.kvs[0] if r.response_range.kvs else None for r in resp.responses
            )
            if _same(t, t2) and c2 is not None and c2.value == c.value:
                raise TransactionConflict(
                    f"task {tid}: a compare of its transaction failed (a key it read or "
                    "compared changed); nothing was written: run the transaction again"
                )
            pair = (t2, c2)  # the task or the session moved: check again on what etcd holds
        else:
            raise StoreError(f"task {tid} kept changing; gave up after {WRITE_RETRIES} tries")
        if rec.has_waiters:
            await part.dependants.settle_many([tid])
        part.touch()

    async def rollback(self) -> None:
        self._part = None  # nothing was sent: the writes waited in the transaction

    def _open(self) -> Transactions:
        if self._part is None:
            raise RuntimeError(f"the transaction of task {self.task_id} has ended")
        return self._part

    def _take(self) -> Transactions:
        part = self._open()
        self._part = None
        return part


def _same(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a.mod_revision == b.mod_revision
