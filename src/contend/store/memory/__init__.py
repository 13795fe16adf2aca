"""The in-memory store: for unit tests and simulations. One process, one event loop.

It is also the reference for the other backends: the contract suite runs unchanged on it.

* :mod:`~contend.store.memory.records`: a task's row, an expert's entry, and the port's
  values (``Task``, ``Claimed``, …) made from them;
* :mod:`~contend.store.memory.index`: pending tasks by queue and requirements, held tasks,
  the ageing schedule, and the choice of what to claim over them;
* :mod:`~contend.store.memory.sessions`: the registered experts and their sessions;
* :mod:`~contend.store.memory.store`: :class:`MemoryStore`, which applies the outcomes that
  :mod:`contend.domain.transitions` decides and keeps the index in step.
"""

from contend.store.memory.records import HISTORY_LIMIT
from contend.store.memory.store import MemoryStore
from contend.store.memory.transactions import MemoryTransaction

__all__ = ["HISTORY_LIMIT", "MemoryStore", "MemoryTransaction"]
