"""What an expert publishes by gossip, and the ExpertRecord its rivals make of it.

The summary holds what competition reads of a rival (``runtime.competition``: queues,
capabilities, tier, capacity, load, and the metrics ``types``, ``active``, ``specialties``,
``prefetched``), in short keys. Gossip carries it in one datagram beside the protocol's own
messages, so it has a byte budget:

* queues, capabilities, tier and capacity must fit. Without them a rival cannot be judged,
  and the expert refuses to start with gossip, saying so;
* per-type history is cut first, keeping the most-run types;
* the specialties go next.

A summary that arrives malformed (a member on another version, say) is ignored, never trusted
in part.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from contend.domain.loadmap import Entry, canonical
from contend.domain.task import Capabilities
from contend.errors import ConfigError
from contend.store.port import ExpertInfo, ExpertRecord

#: The most bytes of canonical JSON a summary takes (the gossip layer's limit for one member's
#: metadata is 1,024 bytes, keys and framing included).
BUDGET = 960


def summary(
    info: ExpertInfo, load: int, metrics: Mapping[str, Any], budget: int = BUDGET
) -> dict[str, Any]:
    """The summary of an expert, cut to *budget* bytes of canonical JSON."""
    base: dict[str, Any] = {
        "id": info.id,
        "q": list(info.queues),
        "c": info.capacity,
        "t": info.tier,
        "l": load,
    }
    caps = info.capabilities
    if caps.tags or caps.resources:
        base["k"] = caps.to_json()
    if info.tier == "emergency":
        base["a"] = bool(metrics.get("active", False))
    prefetched = metrics.get("prefetched", 0)
    if isinstance(prefetched, int) and prefetched > 0:
        base["p"] = prefetched
    size = len(canonical(base).encode())
    if size > budget:
        raise ConfigError(
            f"gossip: expert {info.id!r} needs {size} bytes to publish its queues and "
            f"capabilities, more than the {budget} a gossip summary holds; use fewer or "
            "shorter queue and capability names, or run without --gossip"
        )
    out = dict(base)
    specialties = sorted(str(s) for s in (metrics.get("specialties") or ()))
    if specialties:
        out["s"] = specialties
    types = metrics.get("types")
    if isinstance(types, Mapping) and types:
        # the most-run types first: those a rival's fitness has the most history for
        ranked = sorted(types.items(), key=lambda kv: (-_runs(kv[1]), str(kv[0])))
        out["y"] = {}
        for name, rec in ranked:
            out["y"][str(name)] = rec
            if len(canonical(out).encode()) > budget:
                del out["y"][str(name)]
                break
        if not out["y"]:
            del out["y"]
    if len(canonical(out).encode()) > budget:
        out.pop("s", None)
    return out


def _runs(rec: Any) -> float:
    try:
        return float(rec[0]) + float(rec[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return 0.0


def _str_list(value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return tuple(value)


def _capabilities(value: Any) -> Capabilities | None:
    if value is None:
        return Capabilities()
    if not isinstance(value, Mapping):
        return None
    tags = _str_list(value.get("tags", []))
    resources = value.get("resources", {})
    if tags is None or not isinstance(resources, Mapping):
        return None
    amounts: dict[str, float] = {}
    for name, amount in resources.items():
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            return None
        if not math.isfinite(amount):
            return None
        amounts[str(name)] = float(amount)
    return Capabilities(frozenset(tags), amounts)


def record(entry: Entry, *, heard_at: float, started_at: float) -> ExpertRecord | None:
    """The ExpertRecord a rival's published summary stands for (None: malformed or a
    tombstone). *heard_at* is when this member last heard from it; the lease fields are
    the store's and gossip does not carry them (0)."""
    if entry.text is None:
        return None
    try:
        s = json.loads(entry.text)
    except ValueError:
        return None
    if not isinstance(s, dict):
        return None
    name, tier, capacity, load = s.get("id"), s.get("t"), s.get("c"), s.get("l")
    queues = _str_list(s.get("q"))
    caps = _capabilities(s.get("k"))
    if (
        not isinstance(name, str)
        or queues is None
        or caps is None
        or not isinstance(tier, str)
        or not _count(capacity)
        or not _count(load)
    ):
        return None
    metrics: dict[str, Any] = {"prefetched": s.get("p", 0) if _count(s.get("p", 0)) else 0}
    if isinstance(s.get("y"), dict):
        metrics["types"] = s["y"]
    specialties = _str_list(s.get("s", []))
    if specialties:
        metrics["specialties"] = list(specialties)
    if tier == "emergency":
        metrics["active"] = s.get("a") is True
    return ExpertRecord(
        info=ExpertInfo(id=name, capabilities=caps, queues=queues, capacity=capacity, tier=tier),
        session=f"gossip:{entry.incarnation}",
        alive=True,
        load=load,
        lease_deadline=0.0,
        heartbeat_at=heard_at,
        started_at=started_at,
        metrics=metrics,
    )


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
