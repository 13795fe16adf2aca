"""Writers of one SQLite file take turns (store/sqlite/turns.py): a writer waits for the one
before it instead of polling the write lock, which a process writing again and again won
nearly every time (four experts on one file: two took 98 % of a burst)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from contend.domain.task import TaskSpec
from contend.store.sqlite import SQLiteStore
from contend.store.sqlite.turns import TURN_WAIT, Turns


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Until *check* holds, looking every millisecond; AssertionError after *timeout*."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        await asyncio.sleep(0.001)


async def test_a_writer_waits_for_the_turn_before_it(tmp_path: Path) -> None:
    """While another writer holds its turn, a submit waits for it, even though the write
    lock itself is free meanwhile (here a writer without turns uses it, as a task's own
    transaction does): the waiting submit lands after that write, not before."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    first, second = SQLiteStore(url), SQLiteStore(url)
    await first.open()
    await second.open()
    holder = Turns(str(tmp_path / "s.db"))
    first._db.turns._skip_until = float("inf")  # first writes without turns
    try:
        await holder.take()
        try:
            spec = TaskSpec.build("late")
            late = asyncio.create_task(second.submit([spec]))
            # the late writer is in the queue: its turn taken in hand, its write not done
            await until(lambda: second._db.turns._local.locked(), "the late writer queued")
            assert not late.done()
            await first.submit([TaskSpec.build("early")])
        finally:
            holder.give()
        (done,) = await late
        tasks = sorted(await first.list_tasks(limit=10), key=lambda t: t.created_at)
        ordered = [t.type for t in tasks]
        assert ordered == ["early", "late"], ordered
        assert done.id == spec.id
    finally:
        holder.close()
        await first.close()
        await second.close()


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


async def test_a_turn_never_given_up_is_waited_for_at_most_turn_wait(tmp_path: Path) -> None:
    """A process stopped between its turn and its write (here: one that took the turn and
    sits on it) holds nobody up for long: a write waits TURN_WAIT, then writes without turns
    for a while, so the next one does not wait at all."""
    path = tmp_path / "s.db"
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"{path}-turns"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        await store.submit([TaskSpec.build("one")])
        waited = time.monotonic() - began
        assert TURN_WAIT * 0.9 <= waited < TURN_WAIT + 5, waited
        began = time.monotonic()
        await store.submit([TaskSpec.build("two")])
        assert time.monotonic() - began < TURN_WAIT * 0.9  # skips the turns now
        assert {t.type for t in await store.list_tasks(limit=10)} == {"one", "two"}
    finally:
        holder.kill()
        holder.communicate()  # waits, and closes its pipes
        await store.close()


async def test_a_wait_given_up_hands_the_turn_straight_back(tmp_path: Path) -> None:
    """A writer cancelled while it waits for its turn leaves nothing held once the turn
    comes to it: another process can take it at once."""
    path = str(tmp_path / "f")
    mine, theirs = Turns(path), Turns(path)
    try:
        await theirs.take()
        waiting = asyncio.create_task(mine.take())
        # past its polling, waiting in the kernel on a thread of its own
        await until(
            lambda: any(t.name == "contend-sqlite-turn" for t in threading.enumerate()),
            "a thread waiting for the turn",
        )
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        theirs.give()  # the abandoned wait gets it now, and gives it back
        fd = os.open(f"{path}-turns", os.O_RDWR)

        def free() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        try:
            await until(free, "the abandoned wait to give the turn back")
        finally:
            os.close(fd)
        await mine.take()  # and the cancelled writer can write again
        mine.give()
    finally:
        mine.close()
        theirs.close()


async def test_no_turns_where_the_file_cannot_be_made(tmp_path: Path) -> None:
    """Where the turns file cannot be made, writers take no turns: the lock alone decides."""
    turns = Turns(str(tmp_path / "missing" / "s.db"))
    for _ in range(2):
        await turns.take()
        assert not turns._held and turns._fd is None
        turns.give()
    turns.close()


async def test_no_turns_where_flock_is_refused(tmp_path: Path, monkeypatch) -> None:
    """A system-call filter that refuses flock costs the turns, never a write."""

    def refused(fd: int, op: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(fcntl, "flock", refused)
    store = SQLiteStore(f"sqlite:///{tmp_path / 's.db'}")
    await store.open()
    try:
        await store.submit([TaskSpec.build("t")])
        assert store._db.turns._skip_until == float("inf")
        await store.submit([TaskSpec.build("t")])
        assert len(await store.list_tasks(limit=10)) == 2
    finally:
        await store.close()
