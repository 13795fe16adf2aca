"""Ownership keys: which tasks a session may hold, for the one that returns them when it ends.

A claim transaction puts one key for all the tasks it takes, ``h/{expert}/{session}/{batch}``
with the list of their ids, instead of a key per task (schema 5's ``a/{expert}/{task}``, put by
the claim and deleted by the write that ended the task: two of the eight key operations of a
task's life, a ninth of etcd's CPU per task in a drain of 8-slot experts). The key is an index,
never the truth: a task is held when its record names the expert and the session in an owned
state, so a key may list tasks that are done, stolen or claimed again. Whoever reads one reads
the records too: expire() and end_session() to return what an ended session held, renew() of a
foreign session, a steal's look at its victim, the central leader's count of what each expert
holds.

A key goes when none of its tasks is held any more under it:

* the owner write that ends the last of them deletes it in its own Txn (``Batches.closing``),
  which compares each of those tasks' records: when it lands, none is held;
* renew() reads the records of what its session holds; a task found no longer held at or past
  the claim's fence leaves its batch, and the keys left empty go in one Txn;
* expire() and end_session() delete a session's keys once its tasks are all returned.

A task leaves its batch only on evidence that the claim which put the key is over: a write of
its fence that ended it landed, or its record was read at that fence or later and not held.
A task claimed again by the same session is in the new claim's key and leaves the old one.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from contend.store.etcd.keys import Keys, enc, unenc


def batch_value(tids: Iterable[str]) -> bytes:
    return json.dumps(list(tids), separators=(",", ":")).encode()


def batch_tasks(value: bytes) -> list[str]:
    return [str(t) for t in json.loads(value)]


class Batches:
    """The ownership keys this instance's claims put and the tasks each may still hold,
    with the fence of the claim that took each."""

    def __init__(self) -> None:
        self._tag = os.urandom(4).hex()  # ids unique across instances of one session
        self._ids = itertools.count()
        self._tasks: dict[bytes, dict[str, int]] = {}  # batch key -> {task: claim's fence}
        self._batch: dict[str, bytes] = {}  # task -> the batch key of its latest claim here
        self._session: dict[bytes, str] = {}  # batch key -> its session
        #: batch keys whose tasks all left, still in etcd (a write that could not delete them)
        self.empty: set[bytes] = set()

    def key(self, keys: Keys, expert: str, session: str) -> bytes:
        """A new batch key of *expert*'s *session*."""
        return keys.batch(expert, session, f"{self._tag}{next(self._ids):x}")

    def opened(self, key: bytes, session: str, tasks: Mapping[str, int]) -> None:
        """A claim Txn that put *key* landed, taking *tasks* ({id: fence})."""
        self._tasks[key] = dict(tasks)
        self._session[key] = session
        for tid in tasks:
            old = self._batch.get(tid)
            if old is not None and old != key:
                self._remove(old, tid)
            self._batch[tid] = key

    def left(self, tid: str, fence: float) -> None:
        """*tid* was seen not held at *fence* (a write at that fence ended it, or its record
        was read at that fence or later and not held): its claim here is over, unless this
        instance claimed it again since (a higher fence)."""
        key = self._batch.get(tid)
        if key is None or self._tasks[key][tid] > fence:
            return
        del self._batch[tid]
        self._remove(key, tid)

    def _remove(self, key: bytes, tid: str) -> None:
        tasks = self._tasks[key]
        tasks.pop(tid, None)
        if not tasks:
            del self._tasks[key]
            del self._session[key]
            self.empty.add(key)

    def closing(self, leaving: Mapping[str, int]) -> list[bytes]:
        """The keys to delete in a Txn after which the tasks *leaving* ({id: fence}) are no
        longer held: those whose every task is among them at its claim's fence, and the
        empty ones."""
        keys = {self._batch[t] for t in leaving if t in self._batch}
        out = [
            key
            for key in keys
            if all(leaving.get(t) == fence for t, fence in self._tasks[key].items())
        ]
        return out + list(self.empty)

    def deleted(self, keys: Iterable[bytes]) -> None:
        """A Txn deleting *keys* landed."""
        for key in keys:
            self.empty.discard(key)
            for tid in self._tasks.pop(key, {}):
                self._batch.pop(tid, None)
            self._session.pop(key, None)

    def drop(self, session: str) -> None:
        """Forget *session*'s keys (it ended: expire() deletes them)."""
        for key in [k for k, s in self._session.items() if s == session]:
            for tid in self._tasks.pop(key):
                self._batch.pop(tid, None)
            del self._session[key]


def parse_held(keys: Keys, expert: str, kvs: Iterable[Any]) -> list[tuple[str, str, bytes]]:
    """(task, session, key) for each task the ownership keys *kvs* of *expert* (read under
    ``h/{expert}/``) list: a batch key lists several."""
    base = keys.batches(expert)
    out: list[tuple[str, str, bytes]] = []
    for kv in kvs:
        rest = kv.key[len(base) :].decode()
        session = unenc(rest.partition("/")[0])
        out.extend((tid, session, kv.key) for tid in batch_tasks(kv.value))
    return out


def parse_legacy(keys: Keys, expert: str, kvs: Iterable[Any]) -> list[tuple[str, str, bytes]]:
    """(task, session, key) for each schema-5 ownership key ``a/{expert}/{task}`` ("{fence}
    {session}") an upgraded store may still hold for a session that ended before."""
    base = keys.k("a", enc(expert), "")
    return [
        (
            unenc(kv.key[len(base) :].decode()),
            kv.value.decode().partition(" ")[2],
            kv.key,
        )
        for kv in kvs
    ]
