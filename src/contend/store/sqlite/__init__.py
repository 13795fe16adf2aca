"""The SQLite store: many processes on one host share one database file.

* WAL journal, so readers never wait for the writer.
* Every write is one ``BEGIN IMMEDIATE`` transaction (never a read upgraded to a write), and a
  claim is a single ``UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING`` statement.
* ``busy_timeout`` is 0: SQLite's own busy handler sleeps in growing steps and lets one process
  win nearly every time, so a busy write is retried here after a short random pause instead,
  which shares the lock fairly between processes.
* Wake-ups: ``PRAGMA data_version`` tells, without taking a lock, whether another connection
  committed; an idle expert checks it every few milliseconds.
* A task's own transaction (``ctx.transaction()``, :mod:`~contend.store.sqlite.transactions`)
  is a connection of its own to the file, holding the write lock from its start to its end.
* Times come from this host's boot-time clock, put on the wall clock's scale once per boot
  (:mod:`~contend.store.sqlite.clock`): every process shares it and no one can step it; tests
  inject a fake clock.
* Retention (:mod:`~contend.store.sqlite.retention`): old finished tasks are deleted whole.

Durability: ``synchronous=NORMAL`` by default, which in WAL mode survives any process crash
(``kill -9``) but may lose the last transactions on power loss; add ``?synchronous=full`` to the
URL to survive that too, at the cost of an fsync per commit.
"""

from contend.store.sqlite.schema import APPLICATION_ID, SCHEMA, SCHEMA_VERSION, TASK_COLUMNS
from contend.store.sqlite.store import SQLiteStore
from contend.store.sqlite.transactions import SQLiteTransaction
from contend.store.sqlite.url import parse_sqlite_url

__all__ = [
    "APPLICATION_ID",
    "SCHEMA",
    "SCHEMA_VERSION",
    "TASK_COLUMNS",
    "SQLiteStore",
    "SQLiteTransaction",
    "parse_sqlite_url",
]
