"""Whether the caller of a store call still wants its answer.

A caller that gives up on a store call (``runtime.clock.bounded`` past its deadline) cancels it.
The call's retry loop must then stop, not try again and land its write seconds later. But the
``CancelledError`` can be lost on the way: psycopg_pool's ``check()`` catches it as if a
connection had broken, and Python 3.11's ``asyncio.wait_for`` drops it when the awaited call
ends at the same moment. The task keeps count of the requests to cancel it
(``Task.cancelling()``) whatever happened to the exception, so a retry loop notes the count when
it starts and checks it before every attempt.
"""

from __future__ import annotations

import asyncio


def cancels() -> int:
    """How many times the running task has been asked to stop so far (0 outside a task)."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def check_wanted(since: int) -> None:
    """Raise ``CancelledError`` when the running task was asked to stop after *since* (what
    :func:`cancels` said when the call started), even if that request's exception was lost."""
    if cancels() > since:
        raise asyncio.CancelledError
