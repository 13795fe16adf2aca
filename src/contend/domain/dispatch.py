"""The ``central`` dispatch mode (seed 000 §8): one leader assigns a queue's tasks.

A leadership is a named lease in the store. An expert takes it when nobody holds it, when the
holder's lease lapsed or when the holder's session is no longer live (it ended, was
deregistered, or expired: a successor need not wait out a TTL after a supervisor ended it),
and renews it while it holds it. Each change of hands raises the **term** by one; every
assignment carries the term it was planned under, and the store refuses one whose term is
not the current one (:func:`assign_refusal`), the way a fence refuses a stale owner's write.

The leader plans with the global view (:func:`plan`): the experts' free slots (capacity less
load less tasks already assigned to them and not yet claimed) and their fitness for each task
(``contend.domain.scoring``), greedily, best task first. The store only applies a plan: it sets
the assignee of the tasks that are still pending, central and unassigned (or assigned to an
expert that is gone), and a claim of a central task by anyone else is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from contend.domain.scoring import ExpertView, Fitness, TaskView, default_fitness
from contend.errors import NotLeader


@dataclass(frozen=True, slots=True)
class Leadership:
    """A named leadership as the store holds it: who holds it, under which session, since
    which term, and until when (the store's clock)."""

    name: str
    holder: str | None
    session: str | None
    term: int
    deadline: float


@dataclass(frozen=True, slots=True)
class Lead:
    """What :func:`decide_lead` grants: the term to hold, until *deadline*; *taken* when the
    leadership changed hands (the store writes a new holder and term), not just renewed."""

    term: int
    deadline: float
    taken: bool


def held(current: Leadership | None, now: float, *, holder_live: bool) -> bool:
    """Whether *current* is held by someone right now: a holder, a deadline not passed and a
    live session behind it."""
    return (
        current is not None
        and current.holder is not None
        and current.deadline >= now
        and holder_live
    )


def decide_lead(
    current: Leadership | None,
    expert: str,
    session: str,
    now: float,
    ttl: float,
    *,
    holder_live: bool,
) -> Lead | None:
    """*expert* (in its live *session*) asks to lead: renew a leadership it holds, take one
    that is free, lapsed or whose holder's session is gone (the term grows by one), or get
    None while another holds it. *holder_live*: the holder's session is live now."""
    deadline = now + ttl
    if held(current, now, holder_live=holder_live):
        assert current is not None
        if current.holder == expert and current.session == session:
            return Lead(current.term, deadline, taken=False)
        return None
    term = 1 if current is None else current.term + 1
    return Lead(term, deadline, taken=True)


class Refusal(StrEnum):
    """Why an assignment was refused (``NotLeader.reason``)."""

    NO_LEADER = "no_leader"
    STALE_TERM = "stale_term"
    NOT_HOLDER = "not_holder"
    LAPSED = "lapsed"


def assign_refusal(
    name: str,
    current: Leadership | None,
    expert: str,
    session: str,
    term: int,
    now: float,
    *,
    holder_live: bool,
) -> NotLeader | None:
    """None when *expert* (in *session*) may assign for *name* at *term* now, else the
    :class:`NotLeader` that says why not."""
    if current is None or current.holder is None:
        return NotLeader(name, term, "nobody leads it", reason=Refusal.NO_LEADER)
    if current.term != term:
        detail = f"the current term is {current.term}"
        return NotLeader(name, term, detail, reason=Refusal.STALE_TERM)
    if current.holder != expert or current.session != session:
        detail = f"{expert} does not hold it (holder: {current.holder})"
        return NotLeader(name, term, detail, reason=Refusal.NOT_HOLDER)
    if current.deadline < now or not holder_live:
        return NotLeader(name, term, "the leadership lapsed", reason=Refusal.LAPSED)
    return None


#: The history event of an assignment; its expert is the assignee.
ASSIGNED = "assigned"


def assigned_detail(leader: str, term: int) -> str:
    """The history line's detail of an assignment: who assigned it, at which term."""
    return f"by {leader} at term {term}"


def term_of(detail: str | None) -> int | None:
    """The term an ``assigned`` history line was written at (see :func:`assigned_detail`)."""
    if not detail or " at term " not in detail:
        return None
    try:
        return int(detail.rsplit(" at term ", 1)[1])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Worker:
    """A live expert as the leader plans with it: its view (capabilities, load, history), the
    queues it serves and how many more tasks it may be given now."""

    view: ExpertView
    queues: frozenset[str]
    free: int
    #: The task types its app has (empty: not said; any).
    types: frozenset[str] = frozenset()


def free_slots(capacity: int, load: int, assigned: int, ahead: int = 0) -> int:
    """How many more tasks an expert may be given now: its capacity plus *ahead* (tasks given
    ahead of a free slot, so that a slot that frees is filled at once, without waiting for
    the leader's next round), less what it holds and what it was given and has not claimed
    yet (never below 0)."""
    return max(0, capacity + ahead - load - assigned)


@dataclass(slots=True)
class _Slot:
    worker: Worker
    free: int
    load: int
    given: list[str] = field(default_factory=list)


def plan(
    tasks: Sequence[TaskView],
    workers: Sequence[Worker],
    fitness: Fitness = default_fitness,
) -> dict[str, str]:
    """Assign *tasks* (best first) to *workers*: each task to the fittest worker that serves
    its queue, has a free slot and can run it (fitness above 0), its load counted as it fills
    up, ties to the name first in order. A task nobody can take now stays unassigned.
    Returns {task id: expert}."""
    slots = [_Slot(w, w.free, w.view.load) for w in workers if w.free > 0]
    out: dict[str, str] = {}
    for task in tasks:
        best: tuple[float, str] | None = None
        pick: _Slot | None = None
        for slot in slots:
            w = slot.worker
            if (
                slot.free <= 0
                or task.queue not in w.queues
                or (w.types and task.type not in w.types)
            ):
                continue
            view = slot.worker.view
            score = fitness(_loaded(view, slot.load), task)
            if score <= 0:
                continue
            key = (-score, view.name)
            if best is None or key < best:
                best, pick = key, slot
        if pick is None:
            continue
        out[task.id] = pick.worker.view.name
        pick.free -= 1
        pick.load += 1
        if not any(s.free > 0 for s in slots):
            break
    return out


def _loaded(view: ExpertView, load: int) -> ExpertView:
    if load == view.load:
        return view
    return ExpertView(
        name=view.name,
        capabilities=view.capabilities,
        capacity=view.capacity,
        load=load,
        tier=view.tier,
        specialties=view.specialties,
        history=view.history,
        typical_seconds=view.typical_seconds,
    )
