"""EtcdStore: the Store port on etcd, composed of the parts that do the work."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from contend.errors import SchemaError, StoreError
from contend.store.etcd.auctions import Auctions
from contend.store.etcd.claims import Claims
from contend.store.etcd.config import Options
from contend.store.etcd.dependants import Dependants
from contend.store.etcd.dispatch import Dispatch
from contend.store.etcd.housekeeping import Housekeeping
from contend.store.etcd.inspection import Inspection
from contend.store.etcd.keys import Keys, unenc
from contend.store.etcd.levels import Levels
from contend.store.etcd.manage import Management
from contend.store.etcd.owner import Owned, OwnerWrites
from contend.store.etcd.retention import Retention
from contend.store.etcd.rpc import Etcd
from contend.store.etcd.sessions import Sessions
from contend.store.etcd.submit import PROMISES, Submitter
from contend.store.etcd.transactions import Transactions
from contend.store.etcd.txn import absent, get, mod_is, put, written_before
from contend.store.etcd.watch import Changes
from contend.store.port import CentralDispatch, Store

#: 5: no claim keys (c/) on the leases; 4: v/ holds floors, no o/ index; 3: records are
#: arrays, q/ by priority (docs/etcd.md).
SCHEMA_VERSION = 6
#: A store of these versions becomes SCHEMA_VERSION when opened with no expert live.
UPGRADES_FROM = (4, 5)


class EtcdStore:
    """A store in an etcd v3 cluster, reached over gRPC. One instance per process.

    ``EtcdStore(url, clock=..., timeout=..., max_txn_ops=..., compact_after=...)``: the
    options may also be given in the URL's query (docs/etcd.md). Each operation of the port
    is the method of the part that does it (the table at the end of ``__init__``); the parts
    share one connection (``_etcd``), the key layout (``_keys``) and the clock."""

    promises = PROMISES  # submit.py

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        timeout: float | None = None,
        max_txn_ops: int | None = None,
        compact_after: float | None = None,
        create: bool = True,
    ) -> None:
        self.url = url
        self._create = create  # False: open an existing store only (read-only commands)
        o = Options.of(url, timeout=timeout, max_txn_ops=max_txn_ops, compact_after=compact_after)
        self.options = o
        self.host, self.port = o.host, o.port
        self._clock = clock
        self._keys = keys = Keys(o.prefix)
        self._etcd = etcd = Etcd(
            o.host, o.port, o.timeout, o.max_txn_ops, keys.k("t", ""), keys.k("meta")
        )
        self._changes = Changes(etcd, keys)
        touch = self._changes.touch
        self._sessions = sessions = Sessions(etcd, keys, clock)
        self._levels = levels = Levels(etcd, keys)
        dependants = Dependants(etcd, keys, clock)
        owned: Owned = {}  # what this instance's claims wrote, for the owner writes after them
        self._owner = owner = OwnerWrites(
            etcd, keys, clock, owned, sessions.claimed, sessions.batches, dependants, touch
        )
        self._claims = claims = Claims(etcd, keys, clock, sessions, levels, owned)
        inspection = Inspection(etcd, keys, clock, levels, sessions)
        auctions = Auctions(etcd, keys, clock, sessions)
        housekeeping = Housekeeping(
            etcd, keys, clock, o.compact_after, sessions, dependants, auctions, touch
        )
        manage = Management(etcd, keys, clock, dependants, touch, inspection.get)

        # The port, operation by operation, and the module that holds each.
        self.submit = Submitter(etcd, keys, clock, touch).submit  # submit.py
        self.get = inspection.get  # inspection.py
        self.list_tasks = inspection.list_tasks
        self.dependants = inspection.dependants
        self.ids_with_prefix = inspection.ids_with_prefix
        self.key_states = inspection.key_states
        self.stats = inspection.stats
        self.peek = inspection.peek
        self.next_due = inspection.next_due
        self.backlog = inspection.backlog
        self.list_experts = sessions.experts  # sessions.py
        self.register_expert = sessions.register
        self.renew = sessions.renew
        self.deregister_expert = sessions.deregister
        self.revoke_lease = sessions.revoke_lease  # fault injection: the lease ran out
        self.claim = claims.claim  # claims.py
        self.steal = claims.steal
        self.start = owner.start  # owner.py
        self.checkpoint = owner.checkpoint
        self.progress = owner.progress
        self.complete = owner.complete
        self.fail = owner.fail
        self.release = owner.release
        self.expire = housekeeping.expire  # housekeeping.py
        self.end_session = housekeeping.end_session
        self.bid = auctions.bid  # auctions.py
        dispatch = Dispatch(etcd, keys, clock, touch)
        self.lead = dispatch.lead  # dispatch.py
        self.assign = dispatch.assign
        self.central_backlog = dispatch.central_backlog
        self.cancel = manage.cancel  # manage.py
        self.retry = manage.retry
        self.purge_all = manage.purge_all  # benchmarks and tests: an empty store
        self.compact_history = manage.compact_history
        self.prune = Retention(etcd, keys).prune  # retention.py
        self.wait_for_change = self._changes.wait_for_change  # watch.py
        self.wait_for_work = self._changes.wait_for_work
        self.begin = Transactions(etcd, keys, clock, owned, dependants, touch).begin

    # -- connection --------------------------------------------------------------------------
    async def open(self) -> None:
        if self._etcd.channel is not None:
            return
        self._etcd.connect()
        try:
            await self._etcd.check_server()
            await self._check_schema()
        except BaseException:
            await self.close()
            raise

    async def _check_schema(self) -> None:
        meta = self._keys.k("meta")
        p = self._keys.p
        for _ in range(3):
            # One snapshot: contend writes the meta key before any other key and never deletes
            # it, so keys without it belong to something else, even with contend processes
            # opening the same new prefix at once.
            reads = await self._etcd.reads(
                [get(meta), get(p, prefix=True, limit=1, keys_only=True)]
            )
            found, some = (r.kvs for r in reads)
            if found:
                if self._check_meta(found[0].value) in UPGRADES_FROM:
                    await self._upgrade(found[0])
                    continue  # and read the meta key as it is now
                self._etcd.guard = found[0].value
                return
            if some:
                raise SchemaError(
                    f"etcd prefix {p.decode()!r} at {self.host}:{self.port} holds keys that "
                    "are not a contend store; pick another prefix (etcd://host:port/prefix)"
                )
            if not self._create:
                raise SchemaError(
                    f"etcd prefix {p.decode()!r} at {self.host}:{self.port} is empty: it is "
                    "not (yet) a contend store; submitting a task or starting an expert "
                    "creates one (or check --store)"
                )
            # A new store's meta key names it: one made again at the same place is another one.
            want = json.dumps({"schema": SCHEMA_VERSION, "store": uuid.uuid4().hex}).encode()
            if (await self._etcd.txn([absent(meta)], [put(meta, want)])).succeeded:
                self._etcd.guard = want
                return
        raise StoreError(f"could not set up the contend store at {self._etcd.where()}")

    def _check_meta(self, value: bytes) -> int:
        p = self._keys.p
        try:
            version = json.loads(value)["schema"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SchemaError(
                f"etcd prefix {p.decode()!r} is not a contend store (bad meta key)"
            ) from exc
        if version != SCHEMA_VERSION and version not in UPGRADES_FROM:
            raise SchemaError(
                f"etcd prefix {p.decode()!r} has contend schema version {version}; "
                f"this contend understands version {SCHEMA_VERSION}"
            )
        return int(version)

    async def _upgrade(self, meta: Any) -> None:
        """Make a schema-4 or 5 store schema 6 in place, when no expert holds a session in
        it. Version 5 stopped writing claim keys (c/): a claim's lapse is its session's, so
        an older expert still running would not see this version's claims. Version 6 puts
        one ownership key per claim Txn (h/) where 5 put one per task (a/), which an older
        expert's expire() would not read. With none live, the claim keys went with their
        leases, expire() here still returns what an a/ key of an ended session names, and
        the new meta key (same store id) fails every later write of an older process, which
        then stops (SchemaError)."""
        etcd, k = self._etcd, self._keys.k
        version = json.loads(meta.value)["schema"]
        lives = await etcd.reads([get(k("l", ""), prefix=True, keys_only=True)])
        live = [unenc(kv.key[len(k("l", "")) :].decode()) for kv in lives[0].kvs]
        if live:
            raise SchemaError(
                f"etcd prefix {self._keys.p.decode()!r} has contend schema version "
                f"{version}, and {len(live)} expert(s) of an older contend still hold "
                f"sessions in it ({', '.join(sorted(live)[:5])}): stop them, then start this "
                f"version, which upgrades the store to version {SCHEMA_VERSION} in place"
            )
        old = json.loads(meta.value)
        new = json.dumps({**old, "schema": SCHEMA_VERSION}).encode()
        rev = int(lives[0].header.revision)
        await etcd.txn(
            [mod_is(meta.key, meta.mod_revision), written_before(k("l", ""), rev + 1)],
            [put(meta.key, new)],
        )
        # whether it landed or not (a rival upgraded it, or an expert started meanwhile),
        # the caller reads the meta key again

    async def close(self) -> None:
        await self._changes.close()
        self._sessions.close()
        await self._etcd.close()

    async def now(self) -> float:
        return self._clock()

    async def read_key(self, key: str | bytes) -> bytes | None:
        """The value of a key of your own, outside the store's prefix (what tasks' transactions
        wrote); None when absent."""
        k = key.encode() if isinstance(key, str) else key
        kv = (await self._etcd.read_many([k]))[0]
        return None if kv is None else bytes(kv.value)


def _is_a_store(store: EtcdStore) -> Store:
    return store  # mypy checks here that EtcdStore implements the whole port


def _dispatches(store: EtcdStore) -> CentralDispatch:
    return store  # and that it implements central dispatch (promises.central_dispatch)
