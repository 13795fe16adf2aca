"""SQLite's store time: the host's boot-time clock, put on the wall clock's scale once per boot.

Every process on the host shares the store's leases, so they need one clock, and it must not
move when someone steps the wall clock: a step forward ended every live lease at once, a step
back kept a dead expert's tasks held for as long as the step (the chaos suite's clock scenario).
``CLOCK_BOOTTIME`` is one clock for every process of the host, counts time asleep, and no one
can step it; it starts at zero at boot. So the first process to open the store after a boot
writes ``offset = time.time() - boottime`` under the boot's id into ``contend_meta``, and every
process of that boot reads the same offset: store time = offset + boottime. A new boot means
every session of the last one died, so the process that anchors it also ends their leases.

What it costs: after a step of the wall clock, store time keeps to the clock it had when the
boot was anchored (due times given as dates run off by the step) until the next boot. Where
there is no boot id (not Linux) the store time is the wall clock, as before.
"""

from __future__ import annotations

import json
import sqlite3
import time

BOOT_ID = "/proc/sys/kernel/random/boot_id"
_KEY = "clock"

if hasattr(time, "CLOCK_BOOTTIME"):

    def boottime() -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

else:  # pragma: no cover - not Linux: there is no boot id either
    boottime = time.monotonic


def boot_id(path: str = BOOT_ID) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


class HostClock:
    """The default clock of a SQLite store; the wall clock until :meth:`anchor` ran."""

    def __init__(self, boot: str | None = None) -> None:
        self.boot = boot if boot is not None else boot_id()
        self.offset: float | None = None

    def __call__(self) -> float:
        offset = self.offset
        return time.time() if offset is None else offset + boottime()

    def adopt(self, conn: sqlite3.Connection) -> bool:
        """Take this boot's offset from the store; False if it has none yet (nor needs one:
        without a boot id the clock stays the wall clock)."""
        if self.boot is None:
            return True
        row = conn.execute("SELECT value FROM contend_meta WHERE key = ?", (_KEY,)).fetchone()
        if row is not None:
            try:
                saved = json.loads(row[0])
                if saved.get("boot") == self.boot:
                    self.offset = float(saved["offset"])
                    return True
            except (ValueError, TypeError, KeyError, AttributeError):
                pass  # unreadable: anchored anew
        return False

    def anchor(self, conn: sqlite3.Connection, *, write: bool) -> None:
        """Adopt this boot's offset, or make it: with *write* (inside a write transaction)
        save it and end the leases of the boot before; without (a read-only open) only use
        it, as the next writer will save about the same."""
        if self.adopt(conn):
            return
        wall = time.time()
        self.offset = wall - boottime()
        if not write:
            return
        conn.execute(
            "INSERT OR REPLACE INTO contend_meta (key, value) VALUES (?, ?)",
            (_KEY, json.dumps({"boot": self.boot, "offset": self.offset})),
        )
        # the processes of the last boot are gone: their sessions and leases end now
        conn.execute("UPDATE experts SET lease_deadline = min(lease_deadline, ?)", (wall,))
        conn.execute(
            "UPDATE tasks SET lease_deadline = min(lease_deadline, ?) "
            "WHERE state IN ('claimed', 'running')",
            (wall,),
        )
