"""The memory store's limits: which limit keys exist, each rate key's GCRA state, and the
fair order, kept beside the task map. The rules are ``contend.domain.limits``'."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from contend.domain.limits import (
    FairCandidate,
    KeyState,
    Rate,
    admit,
    fair_order,
    rooms,
    spend,
)
from contend.domain.task import TaskSpec
from contend.store.memory.records import Row


class Limits:
    """Concurrency limits, rate limits and fair share over *tasks* (the store's task map)."""

    def __init__(self, tasks: Mapping[str, Row]) -> None:
        self._tasks = tasks
        self.keyed = 0  # tasks ever submitted with a limit key: none, and claims need not look
        self._fair = 0  # of them, with fair share
        self._rates: dict[str, tuple[Rate, float | None]] = {}  # rate key -> (rate, its tat)

    def note(self, spec: TaskSpec) -> None:
        """A task was submitted."""
        self.keyed += spec.limit_key is not None
        self._fair += spec.fair
        if spec.rate_limit is not None and spec.limit_key is not None:
            # a key's rate is the one its latest submission declared; its state stays
            known = self._rates.get(spec.limit_key)
            self._rates[spec.limit_key] = (spec.rate_limit, known[1] if known else None)

    def holders(self, owned: Iterable[str]) -> dict[str, int] | None:
        """Limit key -> its claimed and running tasks (*owned*: the ids of those); None when
        no task ever had a key (a claim need not look)."""
        if not self.keyed:
            return None
        held: dict[str, int] = {}
        for tid in owned:
            key = self._tasks[tid].spec.limit_key
            if key is not None:
                held[key] = held.get(key, 0) + 1
        return held

    def order(self, held: Mapping[str, int]) -> Callable[[list[str]], list[str]] | None:
        """Claim order with fair share among the keys of fair tasks (None: no fair task)."""
        if not self._fair:
            return None
        rows = self._tasks

        def order(ids: list[str]) -> list[str]:
            heads = (
                FairCandidate(
                    t,
                    rows[t].spec.limit_key if rows[t].spec.fair else None,
                    rows[t].spec.priority,
                    rows[t].aged,
                    rows[t].run_at,
                )
                for t in ids
            )
            return fair_order(heads, held, len(ids))

        return order

    def states(self, keys: Collection[str], owned: Iterable[str]) -> dict[str, KeyState]:
        """Each of *keys* now (*owned*: the ids of the claimed and running tasks)."""
        held = {k: 0 for k in keys}
        for tid in owned:
            key = self._tasks[tid].spec.limit_key
            if key in held:
                held[key] += 1
        out = {}
        for key in keys:
            rate, tat = self._rates.get(key, (None, None))
            out[key] = KeyState(held[key], rate, tat)
        return out

    def room_of(self, keys: Collection[str | None], now: float) -> dict[str, int]:
        """Rate-limited key of *keys* -> the starts its rate allows at *now*."""
        return rooms({k: v for k, v in self._rates.items() if k in keys}, now)

    def admit(
        self,
        mine: Sequence[str],
        chosen: Sequence[str],
        held: Mapping[str, int],
        limit: int,
        now: float,
    ) -> list[str]:
        """The claim: *mine* (assigned central tasks, taken whole), then those of *chosen*
        (in claim order) that every limit admits, up to *limit* in all; the rates spent."""
        rows = self._tasks
        picks = ((t, rows[t].spec.limit_key, rows[t].spec.concurrency_limit) for t in chosen)
        # a key's rate holds back every task of the key, as its concurrency limit does
        keys = {rows[t].spec.limit_key for t in [*mine, *chosen]}
        rated = {k: v for k, v in self._rates.items() if k in keys}
        room = rooms(rated, now)
        for tid in mine:  # the assigned tasks spend their keys' rates first
            key = rows[tid].spec.limit_key
            if key in room:
                room[key] = max(0, room[key] - 1)
        out = [*mine, *admit(picks, held, limit - len(mine), room)]
        spent = spend((rows[t].spec.limit_key for t in out), rated, now)
        self._rates.update((k, (rated[k][0], tat)) for k, tat in spent.items())
        return out
