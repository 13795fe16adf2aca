"""The etcd v3 store: many hosts share one etcd cluster; a claim is one etcd transaction.

docs/etcd.md describes it: the URL and its options, how the protocol maps onto etcd, the key
layout, leases and clocks, running etcd for contend, failures, figures and limits. The modules:

==================  =========================================================================
``store``           EtcdStore: opens, checks the schema, maps each port operation to its part
``config``          the URL and its options
``keys``            the key layout
``record``          the task record and its codec, index values, the Task a record shows
``txn``             operations and compares as tuples, and the TxnRequest built from them
``rpc``             the connection: transactions, lost-reply-safe commits, reads, scans
``levels``          the priority index: entering and leaving it, floors, windowed level reads
``candidates``      which pending tasks a claim tries, in what order (ageing, low lane, spread)
``claims``          claims and steals
``owner``           owner writes (start, checkpoint, complete, fail, release) and refusals
``outcomes``        applying an outcome the domain decided to a task record, and its keys
``ownership``       ownership keys: one per claim Txn, listing what a session may hold
``sessions``        experts' sessions: register, keep-alive, renew, deregister
``housekeeping``    expire(): lapsed sessions' tasks, empty levels, old experts, compaction
``dependants``      waiters of a task that ended
``auctions``        bids and their clearing
``dispatch``        central queues: leaderships, assignments, the leader's read
``submit``          submission
``inspection``      get, list_tasks, stats, peek, backlog, next_due
``payloads``        args, results and checkpoints: inline in the record or under d/
``manage``          cancel, retry, purge_all, compact_history
``retention``       prune: finished tasks deleted whole, from a bounded window of records
``watch``           wake-ups: a watch on the pending index
==================  =========================================================================
"""

from contend.store.etcd.config import etcd_url_options, parse_etcd_url
from contend.store.etcd.housekeeping import LEVEL_SWEEP
from contend.store.etcd.record import Record as _Rec
from contend.store.etcd.store import EtcdStore
from contend.store.etcd.transactions import EtcdTransaction
from contend.store.etcd.txn import DELETE, GET, PUT
from contend.store.etcd.txn import put as _put

__all__ = [
    "DELETE",
    "GET",
    "LEVEL_SWEEP",
    "PUT",
    "EtcdStore",
    "EtcdTransaction",
    "_Rec",
    "_put",
    "etcd_url_options",
    "parse_etcd_url",
]
