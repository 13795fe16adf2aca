"""Fair share on etcd: the order a claim (or a peek) tries candidates in when fair tasks are
among them (``contend.domain.limits.fair_order``).

A fair task is indexed in a level of its key's own, ``q/{queue}/{inv}.{fair key}/`` (keys.py),
so that the head of every fair key is read as the head of a level (candidates.py reads a page
or more of each level from its floor; at most ``FAIR_KEYS`` fair keys' levels of a queue per
read, in turns: ``Levels.fair_turn``), however many tasks other keys have waiting. The pick
ranks up to twice *limit* heads of each of those keys, with every task without a fair key
read: a claim tries the first *limit* of its order and, when rivals won some, the next ones,
which must be as fair (with only *limit* heads of a key ranked, four experts reaching for the
same new tenant's heads left three of them falling back on the busy tenant's tasks).
The keys' claimed and running counts are their holder keys (``n/{limit key}/``, one count
read of at most ``FAIR_KEYS`` prefixes). A queue without fair tasks costs nothing more: no
level more, no count, no reordering."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contend.domain.limits import FAIR_KEYS, FairCandidate, fair_order
from contend.store.etcd.keys import Keys
from contend.store.etcd.rpc import Etcd

#: A candidate as candidates.py finds it: (task id, (−effective priority, due, id), (queue,
#: base priority)).
Found = tuple[str, tuple[int, str, str], tuple[str, int]]


def fair_keys(found: Sequence[Found], fairs: Mapping[str, str]) -> list[str]:
    """The fair keys a fair pick of *found* ranks: the first FAIR_KEYS in claim order."""
    out: dict[str, None] = {}
    for tid, _, _ in found:
        key = fairs.get(tid)
        if key is not None and key not in out:
            if len(out) >= FAIR_KEYS:
                break
            out[key] = None
    return list(out)


async def running(etcd: Etcd, keys: Keys, fair: Sequence[str]) -> dict[str, int]:
    """Fair key -> its tasks claimed or running (its holder keys)."""
    counted = await etcd.counts([keys.holders(k) for k in fair])
    return {k: n for k, (n, _) in zip(fair, counted, strict=True)}


def fair_pick(
    found: Sequence[Found],
    fairs: Mapping[str, str],
    held: Mapping[str, int],
    limit: int,
    lane: Sequence[str],
) -> list[str]:
    """The ids of *found* (best first) in the order to try them, as
    :func:`~contend.store.etcd.candidates.pick` but with fair share: the low lane's first
    (*lane*), then the heads (*fairs*: task id -> its fair key; *held*: fair key -> its
    tasks claimed or running) in fair order, then the rest in claim order."""
    taken = set(lane)
    ranked = set(fair_keys(found, fairs))
    per_key: dict[str, int] = {}
    heads: list[FairCandidate] = []
    for tid, rank, level in found:
        if tid in taken:
            continue
        key = fairs.get(tid)
        if key is not None:
            n = per_key.get(key, 0)
            if key not in ranked or n >= 2 * limit:
                continue
            per_key[key] = n + 1
        heads.append(FairCandidate(tid, key, level[1], -rank[0], float(rank[1])))
    order = fair_order(heads, held, len(heads))
    chosen = dict.fromkeys([*lane, *order])
    return [*chosen, *(f[0] for f in found if f[0] not in chosen)]
