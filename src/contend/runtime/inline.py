"""Which plain (sync) task functions run on the event loop instead of in a worker thread.

A worker thread costs a short function more than the function itself: the hand-over to the
thread, the wake-up back, and the two threads taking the GIL in turn (on a no-op, about a
quarter of an expert's CPU per task). So a task type whose function has proved short runs
on the loop: after :data:`PROMOTE_AFTER` runs in a row in a thread, each shorter than
:data:`SHORT`. A run on the loop that takes longer than :data:`DEMOTE_OVER`, or that calls
``ctx.checkpoint_sync`` / ``ctx.progress_sync``, sends its type back to threads; each such
return multiplies the runs it needs to come back by 8, and after :data:`MAX_DEMOTIONS` the type
stays in threads for the life of the expert. A function that calls the sync context helpers
in a thread is never promoted.

What this costs: a run on the loop holds the loop while it runs, so one long call (a cache
miss that goes to the network) delays the expert's other runs and its heartbeat by that long,
once, before its type goes back to threads. A run with a timeout never runs on the loop (it
could not be stopped there), and ``isolation="thread"`` keeps a type in threads always.
"""

from __future__ import annotations

import logging

from contend.errors import shown

log = logging.getLogger("contend.expert")

#: runs in a row, each shorter than SHORT, before a type runs on the loop
PROMOTE_AFTER = 32
#: seconds: a run in a thread at least this short counts towards promotion
SHORT = 250e-6
#: seconds: a run on the loop longer than this sends its type back to threads
DEMOTE_OVER = 2e-3
#: after this many returns to threads a type stays there
MAX_DEMOTIONS = 3


class InlinePolicy:
    """Per task type: does its next run go on the loop? Fed with how long each run took."""

    def __init__(self) -> None:
        self._streak: dict[str, int] = {}  # short runs in a row, in threads
        self._demotions: dict[str, int] = {}
        self._inline: set[str] = set()

    def on_loop(self, type_name: str) -> bool:
        return type_name in self._inline

    def ran_in_thread(self, type_name: str, seconds: float, *, called_back: bool) -> None:
        if called_back:  # it waits on the loop from its thread: on the loop it never could
            self._demotions[type_name] = MAX_DEMOTIONS
        demotions = self._demotions.get(type_name, 0)
        if demotions >= MAX_DEMOTIONS:
            return
        if seconds >= SHORT:
            self._streak[type_name] = 0
            return
        streak = self._streak.get(type_name, 0) + 1
        if streak >= PROMOTE_AFTER * 8**demotions:
            self._inline.add(type_name)
            streak = 0
        self._streak[type_name] = streak

    def ran_on_loop(self, type_name: str, seconds: float, *, called_back: bool) -> None:
        if seconds <= DEMOTE_OVER and not called_back:
            return
        self._inline.discard(type_name)
        self._streak[type_name] = 0
        n = MAX_DEMOTIONS if called_back else self._demotions.get(type_name, 0) + 1
        self._demotions[type_name] = n
        why = (
            "called a sync context helper"
            if called_back
            else f"took {seconds * 1e3:.1f} ms on the event loop"
        )
        log.info(
            "task type %s %s: its runs go to worker threads%s",
            shown(type_name),
            why,
            "" if n >= MAX_DEMOTIONS else " until they prove short again",
        )
