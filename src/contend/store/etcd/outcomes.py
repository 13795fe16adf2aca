"""Applying what ``contend.domain.transitions`` decided to a task record.

The store decides nothing here: an :class:`~contend.domain.transitions.Outcome` says what the
task becomes, and apply_outcome() writes it into the record and returns the operations on the
other keys the move touches (the priority index, the holder key of a task
with a concurrency limit, a result too big for the record, the end marker its waiters are told
by). The caller puts the record, in the one Txn that also compares what it checked (fence,
owner, claim)."""

from __future__ import annotations

from contend.domain.task import OWNED_STATES, TaskState
from contend.domain.transitions import Attempts, Outcome
from contend.store.etcd.keys import Keys, enc
from contend.store.etcd.levels import enter_pending, leave_pending
from contend.store.etcd.record import INLINE_MAX, Record
from contend.store.etcd.txn import Op, delete, put

P = TaskState.PENDING
KEEP = Attempts.KEEP


def unown(rec: Record) -> None:
    """End the ownership of *rec* (its record is put separately). The ownership key of the
    claim stays: it lists the task, whose record no longer names the owner (ownership.py)."""
    rec.owner, rec.session, rec.lease_deadline = None, None, None


def ended_marker(keys: Keys, rec: Record) -> list[Op]:
    """The marker ``s/{task}`` of a task that just ended with waiters to tell."""
    return [put(keys.k("s", enc(rec.id)), rec.state)] if rec.has_waiters else []


def holding(keys: Keys, rec: Record, held: bool) -> list[Op]:
    """The operation on *rec*'s holder key (``n/{limit key}/{task}``) when it starts to hold
    a place of its limit key (*held*) or stops: none for a task without a limit. Only a claim
    makes a task held, under a compare that the key's holders are as it counted them
    (claims.py); every way out of claimed and running comes through :func:`apply_outcome`,
    which deletes it in the same Txn."""
    key = rec.limit_key
    if key is None:
        return []
    holder = keys.holder(key, rec.id)
    return [put(holder, b"") if held else delete(holder)]


def apply_outcome(keys: Keys, rec: Record, outcome: Outcome, now: float) -> list[Op]:
    """Make *rec* what *outcome* says, at *now*; the operations on keys other than the record.
    The owner, fence and lease of a claim are the caller's to set first (the history line
    carries the fence)."""
    ops: list[Op] = []
    state = outcome.state
    was_held = rec.state in OWNED_STATES
    if rec.limit is not None and was_held != (state in OWNED_STATES):
        ops += holding(keys, rec, not was_held)
    if not outcome.owned and rec.owner is not None:
        unown(rec)
    if rec.indexed and state != P:
        ops += leave_pending(keys, rec)
    if state != P:
        rec.assignee = None  # an assignment is used up by the claim (or by any other end)
    if outcome.attempts is not KEEP:
        rec.attempts = outcome.attempts.apply(rec.attempts)
    rec.run_at = outcome.run_at(rec.run_at, now)
    if outcome.error_json is not None:
        rec.error = outcome.error_json
    result = outcome.result_json
    if result is not None:
        if len(result) <= INLINE_MAX:
            rec.result = result
        else:
            ops.append(put(keys.data(rec.id, "result"), result))
    rec.state = str(state)
    rec.updated_at = now
    rec.event(now, outcome.event, outcome.actor, outcome.detail)
    if state == P:
        ops += enter_pending(keys, rec)
    elif rec.has_waiters and outcome.ends:
        ops += ended_marker(keys, rec)
    return ops
