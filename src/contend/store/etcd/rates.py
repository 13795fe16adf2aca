"""Rate limits on etcd: each rate key's GCRA state in ``r/{limit key}``, a JSON object
``{"interval", "burst", "tat"}`` (``contend.domain.limits.Rate``; ``tat`` null: never started).

A submission declaring a rate writes its interval and burst, keeping the ``tat``, under a
compare on the key as read (so a claim moving ``tat`` meanwhile makes it read again); one
declaring the rate already there writes nothing, so that a steady stream of submissions does
not race the claims. A claim reads the ``r/`` key of each limit key among its tries (in the
same read as their records), admits no more of a key than its room, and in its Txn compares
the key's ``mod_revision`` as read and puts the new ``tat``: of two rivals spending the same
room, the second fails, reads the key again in its failure branch and takes fewer. The rules
are ``contend.domain.limits``'; this module only reads and writes their state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from contend.domain.limits import Rate, spend
from contend.domain.task import TaskSpec
from contend.store.etcd.keys import Keys
from contend.store.etcd.txn import Op, absent, mod_is, put


class RateState(NamedTuple):
    """A rate key as read: its rate, its state, and the revision to compare."""

    rate: Rate
    tat: float | None
    mod_revision: int


def rate_value(rate: Rate, tat: float | None) -> bytes:
    return orjson.dumps({"interval": rate.interval, "burst": rate.burst, "tat": tat})


def rate_state(kv: Any) -> RateState | None:
    """The state an ``r/`` KeyValue holds (None: the key is absent)."""
    if kv is None:
        return None
    d = orjson.loads(kv.value)
    tat = d.get("tat")
    return RateState(
        Rate(float(d["interval"]), int(d["burst"])),
        None if tat is None else float(tat),
        int(kv.mod_revision),
    )


def declared(specs: Iterable[TaskSpec]) -> dict[str, Rate]:
    """Limit key -> the rate the last of *specs* declaring one for it declared."""
    return {s.limit_key: s.rate_limit for s in specs if s.limit_key and s.rate_limit}


def declare(keys: Keys, key: str, rate: Rate, kv: Any) -> tuple[list[Op], list[Op]]:
    """(compares, operations) that make *rate* the rate of *key*, ``r/`` read as *kv*,
    keeping its state; nothing when it already is."""
    known = rate_state(kv)
    rk = keys.rate(key)
    if known is None:
        return [absent(rk)], [put(rk, rate_value(rate, None))]
    if known.rate == rate:
        return [], []
    return [mod_is(rk, known.mod_revision)], [put(rk, rate_value(rate, known.tat))]


def rooms_of(states: Mapping[str, RateState]) -> dict[str, tuple[Rate, float | None]]:
    """The (rate, tat) per key that ``contend.domain.limits.rooms`` and ``spend`` take."""
    return {k: (s.rate, s.tat) for k, s in states.items()}


def spend_ops(
    keys: Keys, states: Mapping[str, RateState], claimed: Sequence[str | None], now: float
) -> tuple[list[Op], list[Op], list[str], dict[str, float]]:
    """For a claim Txn taking tasks of the limit keys *claimed*: the compares that their rate
    keys are as read, the puts of their new ``tat``, those keys, and the new ``tat`` of
    each."""
    moved = spend(claimed, rooms_of(states), now)
    rated = list(moved)
    cmp = [mod_is(keys.rate(k), states[k].mod_revision) for k in rated]
    ops = [put(keys.rate(k), rate_value(states[k].rate, moved[k])) for k in rated]
    return cmp, ops, rated, moved
