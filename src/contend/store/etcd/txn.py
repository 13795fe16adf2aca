"""Building etcd transactions.

Operations and compares are plain tuples, written into a TxnRequest in place by build(): five
times cheaper than making each protobuf message and having the request copy it. An
operation is (PUT, key, value, lease), (DELETE, key, range end or b"") or (GET, key, range
end or b"", keys_only, count_only, limit), (ENTER, level key, position) or (RAISE, level
key, revision, position) (both nested transactions on a priority level's floor); a compare
is (MOD_IS, key, revision), (ABSENT, key), (PRESENT, key), (VALUE_IS, key, value) or
(WRITTEN_BEFORE, key, range end, revision).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aetcd import rpc

from contend.store.etcd.keys import prefix_end

PUT, DELETE, GET, ENTER, RAISE = 0, 1, 2, 3, 4
MOD_IS, ABSENT, PRESENT, VALUE_IS, WRITTEN_BEFORE = 0, 1, 2, 3, 4
Op = tuple[Any, ...]

#: How many times a write re-reads and retries when the keys it compared changed under it.
WRITE_RETRIES = 20


def put(key: bytes, value: bytes | str, lease: int = 0) -> Op:
    return (PUT, key, value.encode() if isinstance(value, str) else value, lease)


def delete(key: bytes, *, prefix: bool = False, end: bytes = b"") -> Op:
    return (DELETE, key, prefix_end(key) if prefix else end)


def get(
    key: bytes,
    *,
    prefix: bool = False,
    end: bytes = b"",
    keys_only: bool = False,
    count_only: bool = False,
    limit: int = 0,
) -> Op:
    return (GET, key, prefix_end(key) if prefix else end, keys_only, count_only, limit)


def enter(level: bytes, position: bytes) -> Op:
    """A task enters a priority level at *position*: the level's floor (the value of its v/
    key) comes down to *position* if it was above it, and the key is put either way, so that
    its revision tells a claim that tasks entered since it read."""
    return (ENTER, level, position)


def raise_floor(level: bytes, revision: int, position: bytes) -> Op:
    """Move a level's floor up to *position*, if its key is still at *revision*."""
    return (RAISE, level, revision, position)


def mod_is(key: bytes, revision: int) -> Op:
    return (MOD_IS, key, revision)


def absent(key: bytes) -> Op:
    return (ABSENT, key)


def present(key: bytes) -> Op:
    return (PRESENT, key)


def value_is(key: bytes, value: bytes) -> Op:
    return (VALUE_IS, key, value)


def written_before(prefix: bytes, revision: int) -> Op:
    """Every key under *prefix* was last written before *revision* (none was put since a read
    at ``revision - 1``); true of an empty range."""
    return (WRITTEN_BEFORE, prefix, prefix_end(prefix), revision)


def one_entry_per_level(ops: Sequence[Op]) -> list[Op]:
    """*ops* with the entries (ENTER) of one priority level made one, at the lowest position:
    etcd refuses a key put twice in a transaction."""
    at: dict[bytes, int] = {}  # level key -> where its entry is in *out*
    out: list[Op] = []
    for op in ops:
        if op[0] == ENTER:
            i = at.get(op[1])
            if i is not None:
                if op[2] < out[i][2]:
                    out[i] = op
                continue
            at[op[1]] = len(out)
        out.append(op)
    return out


def build(compare: Sequence[Op], success: Sequence[Op], failure: Sequence[Op]) -> Any:
    """The TxnRequest of these compares and operations."""
    req = rpc.TxnRequest()
    add = req.compare.add
    for c in compare:
        m = add()
        m.key = c[1]
        kind = c[0]
        if kind == MOD_IS:
            m.target = rpc.Compare.MOD
            m.mod_revision = c[2]
        elif kind == VALUE_IS:
            m.target = rpc.Compare.VALUE
            m.value = c[2]
        elif kind == WRITTEN_BEFORE:
            m.target = rpc.Compare.MOD
            m.result = rpc.Compare.LESS
            m.range_end = c[2]
            m.mod_revision = c[3]
        else:  # the version: 0 for an absent key
            m.target = rpc.Compare.VERSION
            m.version = 0  # set even though 0: it selects the compare's target field
            if kind == PRESENT:
                m.result = rpc.Compare.GREATER
    for ops, into in ((success, req.success), (failure, req.failure)):
        add = into.add
        for op in ops:
            kind = op[0]
            if kind == PUT:
                p = add().request_put
                p.key = op[1]
                p.value = op[2]
                if op[3]:
                    p.lease = op[3]
            elif kind == DELETE:
                d = add().request_delete_range
                d.key = op[1]
                if op[2]:
                    d.range_end = op[2]
            elif kind == ENTER:  # if floor <= position: touch the key, else floor = position
                t = add().request_txn
                c = t.compare.add()
                c.key = op[1]
                c.target = rpc.Compare.VALUE
                c.result = rpc.Compare.LESS  # floor < position + NUL: floor <= position
                c.value = op[2] + b"\0"
                touch = t.success.add().request_put
                touch.key = op[1]
                touch.ignore_value = True
                low = t.failure.add().request_put  # also when the key is absent
                low.key = op[1]
                low.value = op[2]
            elif kind == RAISE:
                t = add().request_txn
                c = t.compare.add()
                c.key = op[1]
                c.target = rpc.Compare.MOD
                c.mod_revision = op[2]
                up = t.success.add().request_put
                up.key = op[1]
                up.value = op[3]
            else:
                r = add().request_range
                r.key = op[1]
                if op[2]:
                    r.range_end = op[2]
                r.keys_only, r.count_only, r.limit = op[3], op[4], op[5]
    return req
