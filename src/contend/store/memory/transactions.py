"""A task's own transaction on the memory store: a small key-value space of JSON values, kept
beside the tasks, that a task reads and writes together with its completion.

It behaves as etcd's software transactional memory does (and as the etcd store's transaction
does): reads go to the store and remember the version they saw; writes wait in the transaction;
``commit`` checks, in one step with nothing awaited in between, that the task is still the
writer's (fence, owner, lease) and that nothing it read has changed since, then applies the
writes and the completion together. A changed read is a
:class:`~contend.errors.TransactionConflict`: nothing is written, run the block again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

from contend.domain.task import JSON, encode_json
from contend.errors import ConfigError, TransactionConflict
from contend.store.port import Completion


class Space(Protocol):
    """What a transaction needs of its store (``MemoryStore``)."""

    def _read_value(self, key: str) -> tuple[str | None, int]: ...

    def _commit_values(
        self,
        expert: str,
        completion: Completion,
        reads: dict[str, int],
        writes: dict[str, str | None],
    ) -> None: ...


def check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"a key of the memory store is a non-empty string, not {key!r}")
    return key


@dataclass(eq=False)
class MemoryTransaction:
    """``async with ctx.transaction() as tx`` on the memory store.

    ``await tx.get(key)`` reads a value (None when absent) and makes the commit depend on it;
    ``tx.put(key, value)`` and ``tx.delete(key)`` write at commit; ``tx.result`` is the task's
    result. Values are JSON, kept as text: what is read is a copy."""

    store: Space
    expert: str
    task_id: str
    fence: int
    result: JSON = None
    _reads: dict[str, int] = field(default_factory=dict, repr=False)  # key -> version read
    _writes: dict[str, str | None] = field(default_factory=dict, repr=False)  # None: delete
    _done: bool = field(default=False, repr=False)

    async def get(self, key: str) -> JSON:
        """The value of *key* as this transaction sees it (its own writes first)."""
        key = check_key(key)
        self._check_open()
        if key in self._writes:
            text = self._writes[key]
        else:
            text, version = self.store._read_value(key)
            self._reads.setdefault(key, version)
        return None if text is None else json.loads(text)

    def put(self, key: str, value: JSON) -> None:
        self._check_open()
        self._writes[check_key(key)] = encode_json(value, f"value of key {key!r}")

    def delete(self, key: str) -> None:
        self._check_open()
        self._writes[check_key(key)] = None

    async def commit(self, completion: Completion) -> None:
        self._check_open()
        self._done = True
        self.store._commit_values(self.expert, completion, self._reads, self._writes)

    async def rollback(self) -> None:
        self._done = True

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError(f"the transaction of task {self.task_id} has ended")


def conflict(task_id: str, key: str) -> TransactionConflict:
    return TransactionConflict(
        f"task {task_id}: key {key!r} changed after this transaction read it; "
        "nothing was written: run the transaction again"
    )
