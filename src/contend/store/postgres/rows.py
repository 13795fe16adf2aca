"""Columns and rows: the task columns read back, the requirement filter, and the conversions
between rows and the domain's records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from contend.domain.payload import decode_args, decode_kwargs
from contend.domain.task import (
    Capabilities,
    load_trace,
)
from contend.store._sql import load
from contend.store.port import Claimed

TASK_COLUMNS = (
    "id, type, queue, state, priority, args, kwargs, key, requirements, attempts, max_attempts, "
    "fence, owner, lease_deadline, run_at, created_at, updated_at, timeout, result, error, "
    "checkpoint, depends_on, progress, trace, if_failed, limit_key, limit_max, "
    "fair_key IS NOT NULL"
)

#: What a claim or a steal returns of each task it takes (read by :func:`claimed`).
CLAIMED_COLUMNS = (
    "t.id, t.type, t.queue, t.args, t.kwargs, t.fence, t.attempts,"
    "   t.max_attempts, t.checkpoint, t.timeout, t.lease_deadline, t.priority, t.run_at,"
    "   t.eff_priority, t.trace"
)

#: The condition that opens ``tasks_oldest`` and ``tasks_lane`` to a query (migration 14):
#: true of every row, and stated by no claim's walk, which then has only ``tasks_claimable``
#: to take. The queries those indexes serve state it (``{t}``: ``t.`` or nothing).
#: ``tasks_ageing`` asks for ``promote_at IS NOT NULL``, which only the ageing sweep implies.
NOT_CLAIMED = "{t}created_at IS NOT NULL"

# The requirement filter: tags a subset of the expert's, every resource need within its amount.
FITS = (
    "(requirements IS NULL OR ("
    "coalesce(requirements->'tags', '[]'::jsonb) <@ %(tags)s::jsonb "
    "AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(coalesce(requirements->'resources', "
    "'{}'::jsonb)) AS need(name, amount) "
    "WHERE coalesce((%(resources)s::jsonb->>need.name)::float8, 0) < need.amount::float8)))"
)


#: The last capabilities :func:`caps` encoded, and their parameters: an expert passes the same
#: object to every claim and peek, and encoding it was a tenth of a claim's own CPU.
_last_caps: tuple[Capabilities, dict[str, str]] | None = None


def caps(capabilities: Capabilities) -> dict[str, str]:
    """The parameters of :data:`FITS` for an expert's capabilities."""
    global _last_caps
    last = _last_caps
    if last is not None and last[0] is capabilities:
        return last[1]
    params = {
        "tags": json.dumps(sorted(capabilities.tags)),
        "resources": json.dumps(dict(capabilities.resources)),
    }
    _last_caps = (capabilities, params)
    return params


def claimed(r: Sequence[Any]) -> Claimed:
    return Claimed(
        id=r[0],
        type=r[1],
        queue=r[2],
        args=decode_args(r[3]),
        kwargs=decode_kwargs(r[4]),
        fence=r[5],
        attempt=r[6],
        max_attempts=r[7],
        checkpoint=load(r[8]),
        timeout=r[9],
        lease_deadline=r[10],
        priority=r[11],
        trace=load_trace(r[14]),
    )
