"""The load map: what every expert last published about itself, merged without coordination.

Each expert owns one register in the map, and only that expert writes it. A write is stamped
``(incarnation, version)``. The incarnation says which run of the expert wrote it; a restart
raises it. The version goes up by one at every publish of that run. Two replicas merge by taking,
for every member, the entry whose stamp is greater. Merge is commutative, associative and
idempotent (``tests/unit/test_loadmap.py`` checks all three with Hypothesis), so replicas that have
seen the same writes hold the same map, whatever order and however many times gossip
delivered them.

When failure detection declares a run dead, the register gets a *tombstone* at that run's last
stamp. A tombstone wins a tie with the entry it buries. So a late copy of the dead run's last
state, still travelling in gossip, cannot bring it back. The run's next publish, at a higher
version (it was only paused, and refuted its death), beats the tombstone. So does any publish of
a later run.

A tombstone costs memory. It is dropped after a time the caller chooses (:meth:`LoadMap.forget`).
By then failure detection has stopped passing the dead run's rumours around. The map holds at
most ``limit`` members, and a new member past that is refused rather than growing it.

Pure: no I/O, no clock of its own. Times are passed in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: The most members a load map holds, tombstones included.
DEFAULT_LIMIT = 10_000


@dataclass(frozen=True, slots=True, order=False)
class Entry:
    """One member's register: its stamp, and the state it published (None: a tombstone).

    ``text`` is the state as canonical JSON (sorted keys, no spaces). Two entries with the same
    stamp are told apart by it, so every pair of entries is ordered and merge never depends on
    which replica came first."""

    incarnation: int
    version: int
    text: str | None

    @property
    def dead(self) -> bool:
        return self.text is None

    @property
    def state(self) -> dict[str, Any]:
        """The published state (empty for a tombstone)."""
        if self.text is None:
            return {}
        value = json.loads(self.text)
        return value if isinstance(value, dict) else {}

    def rank(self) -> tuple[int, int, int, str]:
        """The total order merge follows: stamp, then a tombstone over what it buries, then
        the text (the same stamp with two states only comes from a faulty writer)."""
        return (self.incarnation, self.version, 1 if self.text is None else 0, self.text or "")

    def buried(self) -> Entry:
        """The tombstone of this entry's run, at its stamp."""
        return Entry(self.incarnation, self.version, None)


def canonical(state: Mapping[str, Any]) -> str:
    """*state* as the text an :class:`Entry` holds: sorted keys, no spaces."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def entry(incarnation: int, version: int, state: Mapping[str, Any]) -> Entry:
    return Entry(incarnation, version, canonical(state))


def join(a: Entry, b: Entry) -> Entry:
    """The greater of two entries of one member."""
    return b if b.rank() > a.rank() else a


def merge(a: Mapping[str, Entry], b: Mapping[str, Entry]) -> dict[str, Entry]:
    """Two replicas' maps merged: per member, the greater entry."""
    out = dict(a)
    for member, theirs in b.items():
        mine = out.get(member)
        out[member] = theirs if mine is None else join(mine, theirs)
    return out


class LoadMap:
    """One replica of the load map, with the bookkeeping a replica needs locally: when each
    tombstone was laid, so that it can be forgotten later."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self._entries: dict[str, Entry] = {}
        self._buried_at: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def get(self, member: str) -> Entry | None:
        return self._entries.get(member)

    def entries(self) -> dict[str, Entry]:
        """Every register, tombstones included (a copy)."""
        return dict(self._entries)

    def live(self) -> dict[str, Entry]:
        """The members whose register holds a state, not a tombstone."""
        return {m: e for m, e in self._entries.items() if not e.dead}

    def put(self, member: str, new: Entry, now: float) -> bool:
        """Merge one entry in. Returns True when the map changed. A new member past the
        limit is refused (False): a bound on memory, paid for with convergence at a size
        the gossip layer never reaches (it holds fewer members)."""
        mine = self._entries.get(member)
        if mine is None:
            if len(self._entries) >= self.limit:
                return False
            won = new
        else:
            won = join(mine, new)
            if won is mine:
                return False
        self._entries[member] = won
        if won.dead:
            self._buried_at[member] = now
        else:
            self._buried_at.pop(member, None)
        return True

    def merge(self, other: Mapping[str, Entry], now: float) -> list[str]:
        """Merge a whole replica in. Returns the members whose register changed."""
        return [m for m, e in other.items() if self.put(m, e, now)]

    def bury(self, member: str, now: float, upto: Entry | None = None) -> bool:
        """Lay a tombstone over *member*'s run: at the stamp of *upto* when given (what
        failure detection last saw of the run), else at the stamp this replica holds. A
        death heard before the member itself is remembered, so that a late copy of its
        state stays buried."""
        target = upto if upto is not None else self._entries.get(member)
        if target is None:
            return False
        return self.put(member, target.buried(), now)

    def forget(self, before: float) -> list[str]:
        """Drop the tombstones laid before *before*. Returns the members forgotten."""
        old = [m for m, at in self._buried_at.items() if at < before]
        for member in old:
            del self._buried_at[member]
            self._entries.pop(member, None)
        return old
