"""store._cancel: a retry loop learns that its caller gave up even when a library on the way
swallowed the CancelledError (as psycopg_pool's check() does)."""

from __future__ import annotations

import asyncio

import pytest

from contend.store._cancel import cancels, check_wanted


async def test_a_swallowed_cancellation_is_still_seen() -> None:
    tries: list[int] = []
    inside = asyncio.Event()

    async def retrying() -> None:
        since = cancels()
        while True:
            check_wanted(since)
            tries.append(len(tries))
            try:
                inside.set()
                await asyncio.Event().wait()  # an attempt that hangs
            except asyncio.CancelledError:
                pass  # swallowed, as a library that takes it for a broken connection

    call = asyncio.create_task(retrying())
    await inside.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert tries == [0]  # no second attempt


async def test_a_request_before_the_call_began_does_not_stop_it() -> None:
    ran = asyncio.Event()
    first = asyncio.Event()

    async def caller() -> None:
        try:
            first.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # the caller handled this request itself and goes on
        since = cancels()
        assert since == 1
        check_wanted(since)  # a new call: nothing asked of it yet
        ran.set()

    task = asyncio.create_task(caller())
    await first.wait()
    task.cancel()
    await task
    assert ran.is_set()
