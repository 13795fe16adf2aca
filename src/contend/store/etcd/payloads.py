"""A task's payloads (args, result, checkpoint): in the task record up to INLINE_MAX
characters, else under ``d/{task}/args``, ``d/{task}/result`` and ``d/{task}/checkpoint``."""

from __future__ import annotations

import json
from collections.abc import Sequence

from contend.domain.task import JSON, TaskState
from contend.store.etcd.keys import Keys
from contend.store.etcd.record import Record
from contend.store.etcd.rpc import Etcd

Args = tuple[list[JSON], dict[str, JSON]]


async def read_payloads(
    etcd: Etcd, keys: Keys, recs: Sequence[Record], *, result: bool = True
) -> list[tuple[Args | None, JSON, JSON]]:
    """(args, result, checkpoint) of each record: from the record where it is kept there,
    else from its d/ key, all such keys read in one round trip."""
    wanted: list[bytes] = []
    for rec in recs:
        if rec.args is None:
            wanted.append(keys.data(rec.id, "args"))
        if result and rec.state == TaskState.SUCCEEDED and rec.result is None:
            wanted.append(keys.data(rec.id, "result"))
        if rec.checkpointed is not False:
            wanted.append(keys.data(rec.id, "checkpoint"))
    kvs = await etcd.read_many(wanted)
    found = {k: kv.value for k, kv in zip(wanted, kvs, strict=True) if kv is not None}
    out: list[tuple[Args | None, JSON, JSON]] = []
    for rec in recs:
        a = rec.args if rec.args is not None else found.get(keys.data(rec.id, "args"))
        r = None
        if result and rec.state == TaskState.SUCCEEDED:
            r = rec.result if rec.result is not None else found.get(keys.data(rec.id, "result"))
        c = found.get(keys.data(rec.id, "checkpoint"))
        args = json.loads(a) if a is not None else None
        out.append(
            (
                (args[0], args[1]) if args else None,
                json.loads(r) if r is not None else None,
                json.loads(c) if c is not None else None,
            )
        )
    return out
