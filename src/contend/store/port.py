"""The store port: every backend implements :class:`Store`, in domain words.

Rules every backend keeps (the contract suite, ``contend.testing.contract``, checks them):

* Times are the **store's** clock (``await store.now()``); an expert never compares its own
  clock with another host's.
* ``claim`` is one atomic step: a task is handed to at most one expert, its ``fence`` grows by
  one, ``attempts`` grows by one and its lease deadline is ``now + lease_ttl``.
* Every owner write (``start``, ``checkpoint``, ``complete``, ``fail``, ``release``) names the
  owner and the fence, and lands only if that is still the task's current fence, owner and live
  lease. A refused write changes nothing and is reported as :class:`~contend.errors.FencedOut`.
* ``renew`` keeps every task of one expert session alive in one call and tells the expert which
  tasks the store still considers its own; once a session's lease has lapsed it raises
  :class:`~contend.errors.LeaseLost` and never revives it.
* ``expire`` returns tasks whose lease lapsed to ``pending`` (``dead`` when their attempts are
  spent), keeping their checkpoint.
* ``begin`` opens a task's own transaction on the store's database (where
  ``promises.transactions``): its ``commit`` writes the task's completion under the same fence,
  owner and lease check as ``complete``, inside that transaction, so that the task's own writes
  and its completion land together or not at all; a refused commit rolls back everything.
* ``end_session`` ends one expert's session at once, as if its lease had lapsed: the same
  expiry rule for its tasks, in the same step, and every write of that session fenced out.
* A refused submission (bad dependency, cycle) leaves the store unchanged.
* ``submit`` is all or none up to ``promises.atomic_submit`` tasks (every size when it is
  None). A larger batch may be written in parts: every check still runs before the first
  part, and sending the same specs again (same ids) completes a batch cut short.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from contend.domain import auction
from contend.domain.limits import KeyState
from contend.domain.scoring import TaskView
from contend.domain.task import JSON, Capabilities, Task, TaskSpec, TaskState
from contend.errors import FencedOut


@dataclass(frozen=True, slots=True)
class Submitted:
    id: str
    created: bool  # False when the idempotency key matched an existing task


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task just claimed: everything the expert needs to run it."""

    id: str
    type: str
    queue: str
    args: list[JSON]
    kwargs: dict[str, JSON]
    fence: int
    attempt: int
    max_attempts: int
    checkpoint: JSON
    timeout: float | None
    lease_deadline: float
    priority: int = 0
    trace: Mapping[str, str] | None = None  # the submitter's trace context


class Outrun(list[Claimed]):
    """What a claim returns when rivals took some of the tasks it tried, so that it came
    back with fewer than it asked for while more may still be pending: the claimant should
    look again soon rather than wait for a change of work (none may come: the rest of a
    burst's backlog was there all along). Only a store whose claims are optimistic (etcd:
    read, then compare and commit) returns one; a claim that took what it asked for, or
    all there was, returns a plain list."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Completion:
    task_id: str
    fence: int
    result_json: str  # already encoded and size-checked


@dataclass(frozen=True, slots=True)
class Failure:
    task_id: str
    fence: int
    error_json: str
    retry_delay: float | None  # None: final, go to ``final_state``
    final_state: TaskState = TaskState.DEAD


@dataclass(frozen=True, slots=True)
class ExpertInfo:
    """What an expert publishes about itself when it registers and heartbeats."""

    id: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    queues: tuple[str, ...] = ("default",)
    capacity: int = 1
    tier: str = "general"
    host: str = ""
    pid: int = 0
    #: The task types the expert's app has (empty: not said; an older expert).
    task_types: tuple[str, ...] = ()

    def to_json_text(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "capabilities": self.capabilities.to_json(),
                "queues": list(self.queues),
                "capacity": self.capacity,
                "tier": self.tier,
                "host": self.host,
                "pid": self.pid,
                "task_types": list(self.task_types),
            }
        )

    @classmethod
    def from_json_text(cls, text: str) -> ExpertInfo:
        d = json.loads(text)
        caps = d.get("capabilities") or {}
        return cls(
            id=d["id"],
            capabilities=Capabilities(
                frozenset(caps.get("tags", ())), dict(caps.get("resources", {}))
            ),
            queues=tuple(d.get("queues", ("default",))),
            capacity=int(d.get("capacity", 1)),
            tier=d.get("tier", "general"),
            host=d.get("host", ""),
            pid=int(d.get("pid", 0)),
            task_types=tuple(d.get("task_types", ())),
        )


@dataclass(frozen=True, slots=True)
class ExpertRecord:
    info: ExpertInfo
    session: str
    alive: bool
    load: int
    lease_deadline: float
    heartbeat_at: float
    started_at: float
    claim_attempts: int = 0
    claims_won: int = 0
    tasks_done: int = 0
    metrics: Mapping[str, JSON] = field(default_factory=dict)

    def to_json(self) -> dict[str, JSON]:
        return {
            "id": self.info.id,
            "alive": self.alive,
            "session": self.session,
            "capabilities": self.info.capabilities.to_json(),
            "queues": list(self.info.queues),
            "capacity": self.info.capacity,
            "tier": self.info.tier,
            "host": self.info.host,
            "pid": self.info.pid,
            "task_types": list(self.info.task_types),
            "load": self.load,
            "lease_deadline": self.lease_deadline,
            "heartbeat_at": self.heartbeat_at,
            "started_at": self.started_at,
            "claim_attempts": self.claim_attempts,
            "claims_won": self.claims_won,
            "tasks_done": self.tasks_done,
            "metrics": dict(self.metrics),
        }


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What an expert sends with each renewal: its load and cumulative counters."""

    load: int = 0
    claim_attempts: int = 0
    claims_won: int = 0
    tasks_done: int = 0
    #: Free-form JSON the store keeps as is and hands back in ExpertRecord.metrics: per task
    #: type results and speed, lost races, window length, tier state (see runtime.expert).
    metrics: Mapping[str, JSON] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Auction:
    """The state of the auction for one pending task (seed 000 §2.1).

    The first bid opens it; it closes ``window`` seconds later by the store's clock. Bids are
    ranked best first (higher score, then earlier bid). After the close the top bidder may claim;
    the bidder ranked *r* (0-based) may claim from ``closes_at + r × grace``, and anyone from
    ``closes_at + len(bids) × grace``, so a vanished winner never strands the task.
    """

    task_id: str
    now: float
    closes_at: float
    bids: tuple[tuple[str, float], ...]  # (expert, score), best first
    open: bool = True  # False when the task is no longer pending
    grace: float = auction.DEFAULT_GRACE  # set by the first bid

    def rank(self, expert: str) -> int:
        return auction.rank(self.bids, expert)

    def may_claim_at(self, expert: str, grace: float | None = None) -> float:
        """When *expert* may claim: the store refuses a claim before then (Store.claim)."""
        return auction.may_claim_at(
            self.closes_at, self.grace if grace is None else grace, self.bids, expert
        )


@dataclass(frozen=True, slots=True)
class Backlog:
    pending: int
    oldest_age: float | None  # seconds since the oldest due pending task became due


@dataclass(frozen=True, slots=True)
class StoreStats:
    now: float
    counts: dict[str, dict[str, int]]  # queue -> state -> count
    experts: list[ExpertRecord]
    done_last_minute: int
    oldest_pending_age: float | None
    #: queue -> tasks that succeeded in the last minute (the split of ``done_last_minute``),
    #: so that each stage of a pipeline has its own rate; queues without any are left out.
    done_by_queue: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, JSON]:
        attempts = sum(e.claim_attempts for e in self.experts)
        won = sum(e.claims_won for e in self.experts)
        return {
            "now": self.now,
            "queues": self.counts,
            "experts": [e.to_json() for e in self.experts],
            "throughput_per_s": self.done_last_minute / 60.0,
            "done_last_minute_by_queue": dict(self.done_by_queue),
            "oldest_pending_age": self.oldest_pending_age,
            "competition": {
                "claim_attempts": attempts,
                "claims_won": won,
                "success_rate": (won / attempts) if attempts else None,
            },
        }


@dataclass(frozen=True, slots=True)
class Promises:
    """What a backend promises where the port lets backends differ; the contract suite reads
    it instead of assuming.

    * ``atomic_submit`` — the largest submission written all or none (None: any size).
    * ``transactions`` — :meth:`Store.begin` gives a task a transaction of its own on the
      store's database (``ctx.transaction()``); False: ``begin`` raises ConfigError.
    * ``exclusive_transactions`` — such a transaction holds the store's write lock from
      ``begin`` to its end (SQLite): no other writer, in any process, writes meanwhile.
    * ``concurrency_limits`` — claims keep each task's concurrency limit
      (``contend.domain.limits``); False: a submission of a task with a limit raises
      ConfigError and writes nothing.
    * ``rate_limits`` — claims keep each limit key's rate (``contend.domain.limits.Rate``);
      False: a submission of a task with a rate limit raises ConfigError, writing nothing.
    * ``fair_share`` — claims share slots fairly among the limit keys of fair tasks
      (``contend.domain.limits.fair_order``); False: such a submission is refused the same way.
    * ``central_dispatch`` — the store is also a :class:`CentralDispatch`: leaderships, terms
      and assignments for ``central`` queues (``contend.domain.dispatch``); False: the app
      refuses to submit to a central queue and an expert refuses to serve one (ConfigError,
      nothing written).
    """

    atomic_submit: int | None = None
    transactions: bool = False
    exclusive_transactions: bool = False
    concurrency_limits: bool = False
    rate_limits: bool = False
    fair_share: bool = False
    central_dispatch: bool = False


@dataclass(frozen=True, slots=True)
class CentralBacklog:
    """What a central queue's leader reads before it plans: the pending central tasks that
    need an assignee (none yet, or one that is not live), best first, and how many pending
    central tasks each live expert was given and has not claimed yet, and how many tasks it
    holds."""

    unassigned: list[TaskView]
    assigned: dict[str, int]
    #: {live expert: tasks it holds now (claimed or running, any queue)}: its load as the
    #: store knows it, fresher than its last heartbeat.
    held: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class CentralDispatch(Protocol):
    """The part of a store that ``central`` queues need (where ``promises.central_dispatch``).

    * ``lead`` takes or renews the leadership *name* for *expert* in its live *session*: it
      may when nobody holds it, when the holder's lease on it lapsed, when the holder's
      session is no longer live (ended, deregistered, expired: a successor takes over at once)
      or when *expert* holds it in *session* already. Returns the term it holds — a number
      that grows by one each time the leadership changes hands — or None while another
      holds it. Raises LeaseLost when *session* is not live.
    * ``assign`` applies a leader's plan in one atomic step, or nothing: it raises
      :class:`~contend.errors.NotLeader` (writing nothing) unless *expert* holds *name* at
      *term* in *session* with a live lease; otherwise it gives each task to its expert when
      the task is still pending and central and has no live assignee, writes an ``assigned``
      history line (``contend.domain.dispatch.assigned_detail``) and returns how many it gave.
    * A central task is claimable (``Store.claim``) only by its assignee; ``peek`` does not
      show central tasks and ``steal`` never takes one.
    """

    async def lead(self, expert: str, session: str, name: str, ttl: float) -> int | None: ...

    async def assign(
        self,
        expert: str,
        session: str,
        name: str,
        term: int,
        assignments: Mapping[str, str],
    ) -> int: ...

    async def central_backlog(
        self, queues: Sequence[str], live: Collection[str], limit: int
    ) -> CentralBacklog:
        """Pending central tasks in *queues* with no assignee or one not in *live*, best
        first (claim order), up to *limit*; {live expert: its pending assigned tasks}; and
        {live expert: the tasks it holds, claimed or running}."""


class TaskTransaction(Protocol):
    """A task's own transaction on the store's database, opened by :meth:`Store.begin` for the
    task's owner at its fence. Each backend's class adds what the task writes with (a
    PostgreSQL or SQLite ``connection``; operations and compares for etcd and the memory
    store); ``result`` is what the task sets as its result (JSON, None by default).

    Exactly one of ``commit`` or ``rollback`` ends it."""

    result: JSON

    async def commit(self, completion: Completion) -> None:
        """Write *completion* (the task's result under its fence) in this transaction and
        commit both, or neither. The fence, owner and lease are checked inside the
        transaction, as ``complete`` checks them. Raises :class:`~contend.errors.FencedOut`
        (rolled back: the writer no longer holds the task) or
        :class:`~contend.errors.TransactionConflict` (rolled back: a compare of the task's
        own failed, or the database refused a conflict; the claim still holds). Any other
        error rolls back too, unless the commit itself was sent and got no answer: then the
        outcome is unknown (the error says so) — both or neither, still."""

    async def rollback(self) -> None:
        """Undo everything written in the transaction and end it. Safe to call twice, and
        after a failed commit."""


@runtime_checkable
class Store(Protocol):
    """The port. All methods are coroutines; a backend may block briefly inside them."""

    url: str
    promises: Promises

    async def open(self) -> None:
        """Connect, create or check the schema. Raises SchemaError for a foreign target."""

    async def close(self) -> None: ...

    async def now(self) -> float:
        """The store's clock, seconds since the epoch."""

    # -- submission and inspection ---------------------------------------------------------
    async def submit(self, specs: Sequence[TaskSpec]) -> list[Submitted]:
        """Insert tasks atomically (all or none). A spec whose key exists returns that task."""

    async def get(self, task_id: str, *, history: bool = False) -> Task:
        """Raises TaskNotFound."""

    async def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        queue: str | None = None,
        type: str | None = None,
        newest: bool = False,
        limit: int = 100,
    ) -> list[Task]:
        """Up to *limit* tasks of *state*, *queue* and *type* (each None: any), by id: the
        oldest submitted first, or the newest first when *newest*."""

    async def dependants(self, task_id: str, *, limit: int = 100) -> list[Task]:
        """The tasks that name *task_id* among their dependencies, whatever their state (the
        edges a task waits on are gone once that dependency ends; ``depends_on`` keeps them),
        by id, at most *limit*. ``[]`` for a task that none depends on, or that is not there.
        For people and tools (``contend tasks show``): it may read every task."""

    async def ids_with_prefix(self, prefix: str, *, limit: int = 10) -> list[str]:
        """The ids that start with *prefix*, by id, at most *limit*: what turns the few
        characters a person types (``contend tasks show 01a231``) into a task. *prefix* is
        6 to 28 hex digits (``contend.domain.ids.check_id_prefix``: a TaskError, and nothing
        read, otherwise). A range read of the primary key, never a scan of every task."""

    async def key_states(self, keys: Collection[str]) -> dict[str, KeyState]:
        """Each of *keys* (limit keys) as the store holds it now: how many of its tasks are
        claimed or running, and its rate (the latest submission's) with the rate's state.
        Every key asked for is in the answer (``KeyState()`` for one the store knows nothing
        of). What ``contend tasks show`` and the dashboard say holds a task back; a claim
        reads the same numbers inside its own step."""

    async def stats(self) -> StoreStats: ...

    async def list_experts(self) -> list[ExpertRecord]: ...

    # -- the claim protocol ----------------------------------------------------------------
    async def peek(
        self,
        queues: Sequence[str],
        capabilities: Capabilities,
        limit: int,
        *,
        low_lane: int = 0,
        types: Collection[str] | None = None,
    ) -> list[TaskView]:
        """Claimable tasks (pending, due) this expert can run, best first. Reads only.
        ``low_lane`` and ``types`` as in :meth:`claim`."""

    async def claim(
        self,
        expert: str,
        session: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
        task_ids: Sequence[str] | None = None,
        start: bool = True,
        low_lane: int = 0,
        types: Collection[str] | None = None,
    ) -> list[Claimed]:
        """Atomically claim up to *limit* tasks (only those in *task_ids* when given), moving
        them to ``running`` (``claimed`` when ``start`` is false). Raises LeaseLost when the
        session is not live.

        A task is claimable when it is pending and due, in one of *queues*, its requirements
        met by *capabilities* and, when *types* is given, of one of those task types (the
        types the expert's app has: an expert never claims a task it has no function for;
        ``None``: any type).

        Order: highest *effective* priority first (it grows as a task waits; ``expire`` raises
        it, see ``contend.domain.task.aged_priority``), then first in, first out.

        The low-priority lane: up to ``low_lane`` of the *limit* go instead to the tasks due
        the longest among those whose base priority is below the highest base priority of
        the claimable tasks (of *task_ids*, when given), so that a flood of urgent work never
        starves the rest, at any level below it (seed 000 §6). Where there are fewer such
        tasks, the best take their places. Levels are found a few at a time: only the
        :data:`~contend.domain.task.LANE_LEVELS` highest base priorities of a queue below
        its top take part.

        Concurrency limits (where ``promises.concurrency_limits``): a task with a limit key is
        claimable only while fewer than its ``concurrency_limit`` tasks of that key are
        claimed or running, this claim's included (``contend.domain.limits.admit``).

        Rate limits (where ``promises.rate_limits``): a task with a rate is claimable only while
        its key's rate has room (``Rate.room``); each claim of one spends it (``spend``).

        Fair share (where ``promises.fair_share``): among tasks of equal base priority, the
        claim takes fair tasks so as to even out their keys' claimed and running counts
        (``contend.domain.limits.fair_order``), looking at the heads of up to ``FAIR_KEYS``
        keys of a queue per claim. ``peek`` shows the same order.

        Central tasks (where ``promises.central_dispatch``): claimable by their assignee
        alone (:class:`CentralDispatch`), and before the others it may claim; ``peek``
        never shows them.

        A claim that rivals outran (it came back short while more may be pending) may
        return an :class:`Outrun`."""

    async def steal(
        self,
        thief: str,
        session: str,
        victim: str,
        queues: Sequence[str],
        capabilities: Capabilities,
        *,
        limit: int,
        lease_ttl: float,
        types: Collection[str] | None = None,
    ) -> list[Claimed]:
        """Work stealing (seed 003): take up to *limit* of *victim*'s claimed-but-unstarted
        tasks in one atomic step, as a claim does (fence + 1, new owner, running, new lease),
        without counting an attempt; *queues*, *capabilities* and *types* as in a claim. The victim's ``start`` of a stolen task is fenced out, so
        it never runs it. Raises LeaseLost when the thief's session is not live."""

    async def start(self, expert: str, items: Sequence[tuple[str, int]]) -> list[FencedOut | None]:
        """Move claimed tasks (id, fence) to running."""

    async def renew(
        self, expert: str, session: str, lease_ttl: float, beat: Heartbeat
    ) -> dict[str, int]:
        """Extend the session and all its tasks' leases; return {task id: fence} it holds."""

    async def checkpoint(self, expert: str, task_id: str, fence: int, state_json: str) -> None:
        """Save a running task's state; raises FencedOut."""

    async def progress(self, expert: str, task_id: str, fence: int, progress_json: str) -> None:
        """Save a running task's progress (``Task.progress``), fenced as a checkpoint is;
        raises FencedOut."""

    async def complete(
        self, expert: str, items: Sequence[Completion]
    ) -> list[FencedOut | None]: ...

    async def fail(self, expert: str, items: Sequence[Failure]) -> list[FencedOut | None]: ...

    async def release(
        self, expert: str, items: Sequence[tuple[str, int]]
    ) -> list[FencedOut | None]:
        """Give tasks back unrun: pending at once, the attempt not counted."""

    async def expire(self) -> int:
        """Return lapsed tasks to pending (or dead); returns how many moved."""

    async def begin(self, expert: str, task_id: str, fence: int) -> TaskTransaction:
        """Open the task's own transaction on the store's database, for *expert*, the owner of
        *task_id* at *fence*. Raises FencedOut (and opens nothing) when it does not hold the
        task now, ConfigError when ``promises.transactions`` is false."""

    # -- management ------------------------------------------------------------------------
    async def cancel(self, task_id: str) -> Task:
        """Cancel a pending, waiting, claimed or running task (its owner is fenced out)."""

    async def retry(self, task_id: str) -> Task:
        """Send a failed, dead or cancelled task back to pending with fresh attempts."""

    async def prune(self, before: float, limit: int = 1000, *, keep_events: int = 100) -> int:
        """Delete up to *limit* finished tasks (succeeded, failed, dead, cancelled) last changed
        before *before* (the store's clock), oldest first, whole: row, history, payload,
        result, dependency edges; never one that a waiting task still waits on. Then cap the
        history of up to *limit* tasks at their newest *keep_events* lines. Returns how many
        tasks it deleted (``contend.domain.retention``)."""

    async def register_expert(self, info: ExpertInfo, lease_ttl: float) -> str:
        """Start a session; raises ExpertConflict when *info.id* is live. Returns the session."""

    async def deregister_expert(self, expert: str, session: str) -> None: ...

    async def end_session(self, expert: str, session: str) -> int:
        """End *expert*'s *session* now, as if its lease had lapsed: what a supervisor does
        when it sees the expert's process die, so that its tasks need not wait out the lease.
        The session stops being live and every task claimed or running under the expert's name
        goes through the expiry rule (pending again, or dead on its last attempt; checkpoint
        kept), ready for others to claim: in one transaction where the backend has them (on
        etcd the lease's revocation is the atomic step, and the tasks follow in the same call). Should the expert be alive after all, it is fenced out: its
        renewals raise LeaseLost and its writes are refused. Returns how many tasks it gave
        back; 0, changing nothing, when *session* is not *expert*'s current session."""

    # -- wake-ups --------------------------------------------------------------------------
    async def wait_for_change(self, timeout: float) -> None:
        """Return soon after the store may have changed, or after *timeout* seconds."""

    async def wait_for_work(self, timeout: float) -> None:
        """Return soon after a task may have become claimable (submitted, pending again, a
        dependency ended, a limit's slot freed, given by a leader), or after *timeout*
        seconds: what an idle expert waits for. A store that cannot tell those changes from
        the others returns after any change, as :meth:`wait_for_change` does. (A plain
        task's end woke every idle expert, which read the queue for nothing: among 200
        simulated experts, 244 claim rounds per task of a batch.)"""

    async def next_due(self, queues: Sequence[str], *, later: bool = False) -> float | None:
        """The earliest ``run_at`` of a pending task in *queues*, or None. With *later*, the
        store may leave out the tasks due already (PostgreSQL does: behind a transaction that
        holds vacuum back, reaching the first of them walks past every task claimed since)."""

    async def backlog(self, queues: Sequence[str]) -> Backlog:
        """How many tasks in *queues* are pending and due now, and the oldest one's age."""

    # -- auctions --------------------------------------------------------------------------
    async def bid(
        self,
        expert: str,
        session: str,
        task_id: str,
        score: float,
        window: float,
        grace: float = auction.DEFAULT_GRACE,
    ) -> Auction:
        """Place (or repeat) this expert's bid on a pending task; the first bid opens the auction
        for *window* seconds and fixes its *grace* (``contend.domain.auction``). A bid after the
        close is not ranked (it returns the auction as it stands). Raises LeaseLost for a
        session that is not live; a task that is not pending gives ``open=False``. Bids on
        tasks that are no longer pending are cleared by ``expire``.

        Claims keep the auction's order: while a task's auction holds an expert back (before
        the close, then until its rank's turn, ``Auction.may_claim_at``), the task is not
        claimable by that expert, named or not."""
