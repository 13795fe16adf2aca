"""The PostgreSQL store: experts on many hosts share one database.

* A claim is one statement: ``UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED LIMIT n)``, with
  requirement filtering in SQL (jsonb containment for tags, a resource comparison), so two
  claimers never wait on each other and never take the same task.
* The domain (``contend.domain.transitions``) decides what every event does to a task; this
  store only applies the outcomes (``apply``): one ``UPDATE … FROM unnest(…)`` per batch, each
  item written only while its guard holds. For an owner write the guard is the fence, the
  owner, an accepted state and both leases; items it did not touch are reported as
  :class:`~contend.errors.FencedOut`, explained by the domain's ``refusal`` from what is read
  back in the same transaction.
* Times are the database's clock (``now()``, the transaction's start) as float8 epoch seconds,
  unless a *clock* is injected (tests), whose value is then passed to every statement instead.
* Wake-ups: writes that make work claimable ``NOTIFY`` a channel; a dedicated connection
  ``LISTEN``s to it. If that connection drops it reconnects with back-off, and meanwhile
  :meth:`PostgresStore.wait_for_change` returns after a short poll interval.
* Connection errors (a server restart, a killed backend) are retried with back-off for a
  bounded time, then raised as :class:`~contend.errors.StoreError` with the cause.
* The schema is versioned (``contend_schema_version``); :meth:`PostgresStore.open` creates it in
  an empty database and refuses a schema of another version: run ``contend migrate``.

URL options (query string, removed before connecting): ``schema`` (default ``contend``),
``listen`` (``on``/``off``), ``listen_url`` (a percent-encoded URL for the LISTEN connection,
to bypass a transaction-mode PgBouncer), ``pgbouncer`` (``true``: no prepared statements and
no LISTEN unless ``listen_url`` is given), ``pool_size``. See ``docs/postgres.md``.

Where things are:

======================  ======================================================================
``store``               :class:`PostgresStore`, handing each operation to one module below
``url``                 the store URL and its options; a URL safe to print
``database``            the connection pool, retries, the ``{s}``/``{now}`` holes of SQL text
``migrations``          the schema's versioned steps; ``schema`` applies and checks them
``rows``                task columns, the requirement filter, rows to domain records
``apply``               the one statement that applies decided outcomes
``submission``          submit: tasks, dependency edges and the wake-up in one statement
``claims``              peek, claim and steal (``FOR UPDATE SKIP LOCKED``)
``owner_writes``        start, checkpoint, complete, fail, release (fenced, batched)
``refusals``            why a fenced write did not land
``retention``           prune: old finished tasks deleted whole, histories capped
``transactions``        a task's own transaction, its completion written in it under the fence
``sessions``            register, renew, deregister an expert; the liveness check
``housekeeping``        expire lapsed claims, age pending tasks, drop finished auctions
``auctions``            bids, their ranking, and the order claims keep
``dispatch``            central queues: lead, assign (under a term), the leader's read
``dependants``          what a task's end does to the tasks waiting on it
``management``          cancel and retry by hand; purge a schema
``wakeups``             LISTEN/NOTIFY and ``wait_for_change``
``inspection``          get, list, stats, experts, backlog, next due
======================  ======================================================================
"""

from contend.store.postgres.migrations import SCHEMA_VERSION
from contend.store.postgres.store import PostgresStore
from contend.store.postgres.transactions import PostgresTransaction
from contend.store.postgres.url import parse_postgres_url

__all__ = ["SCHEMA_VERSION", "PostgresStore", "PostgresTransaction", "parse_postgres_url"]
