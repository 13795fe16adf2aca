"""A sorted set for the in-memory store's indexes, with no third-party dependency.

Keys live in a list of short sorted lists (the idea behind ``sortedcontainers.SortedList``,
reduced to what the store needs), so inserting or removing one key moves at most a few hundred
references instead of shifting one long list, and iteration can start at any key.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_Ordered)

#: Sublists are split when they grow past twice this length.
LOAD = 256


class SortedKeys(Generic[K]):
    """Distinct keys in ascending order."""

    __slots__ = ("_len", "_lists", "_maxes")

    def __init__(self) -> None:
        self._lists: list[list[K]] = []
        self._maxes: list[K] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def add(self, key: K) -> None:
        maxes, lists = self._maxes, self._lists
        if not maxes:
            lists.append([key])
            maxes.append(key)
        else:
            i = bisect_left(maxes, key)
            if i == len(maxes):
                i -= 1
                lists[i].append(key)
                maxes[i] = key
            else:
                insort(lists[i], key)
            lst = lists[i]
            if len(lst) > 2 * LOAD:
                lists.insert(i + 1, lst[LOAD:])
                del lst[LOAD:]
                maxes.insert(i, lst[-1])
        self._len += 1

    def discard(self, key: K) -> bool:
        """Remove *key*; False when it was not there."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        if i == len(maxes):
            return False
        lst = self._lists[i]
        j = bisect_left(lst, key)
        if j == len(lst) or lst[j] != key:
            return False
        del lst[j]
        if lst:
            maxes[i] = lst[-1]
        else:
            del self._lists[i]
            del maxes[i]
        self._len -= 1
        return True

    def first_from(self, start: K | None = None) -> K | None:
        """The smallest key ≥ *start* (or the smallest key), or None."""
        return next(self.iter_from(start), None)

    def iter_from(self, start: K | None = None) -> Iterator[K]:
        """Keys ≥ *start* in order. Do not change the set while iterating."""
        if start is None:
            i, j = 0, 0
        else:
            i = bisect_left(self._maxes, start)
            if i == len(self._maxes):
                return
            j = bisect_left(self._lists[i], start)
        lists = self._lists
        for n in range(i, len(lists)):
            lst = lists[n]
            yield from (lst[j:] if j else lst)
            j = 0
