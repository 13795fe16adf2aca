"""Faults of the embedded store: kill -9 in the middle of write bursts (then SQLite's own
``PRAGMA integrity_check``), a disk that fills up (a small tmpfs), and a write lock another
process holds for longer than the lease (the store hangs for everyone)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from contend.testing.chaos.procs import child_env, submitter
from contend.testing.chaos.scenario import Run
from contend.testing.chaos.servers import SQLiteBackend


def integrity(path: Path) -> str:
    """SQLite's verdict on the file: ``ok``, or what is wrong."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()
    return "; ".join(str(r[0]) for r in rows)


def _path(run: Run) -> Path:
    assert isinstance(run.backend, SQLiteBackend)
    return run.backend.path


async def bursts(run: Run) -> None:
    """Experts committing and checkpointing as fast as they can (every step of every task
    is a write) and a submitter writing a batch in chunks, killed with SIGKILL again and
    again (the submitter once, in the middle of its batch, then run again); the file must pass
    ``PRAGMA integrity_check`` after every kill and at the end."""
    size = run.size
    direct = size.tasks // 4
    await run.submit(direct, steps=10, step_time=0.0, every=1)
    for i in range(size.experts):
        run.experts.start(f"e{i}", concurrency=16)
    batch = run.batch_file("burst", size.tasks - direct, steps=3, every=1)
    log = run.workdir / "submitter.log"
    sub = submitter(run.backend.url, batch, log)

    async def first_chunk() -> bool:
        return sum((await run.counts()).values()) > direct

    await run.until(first_chunk, 60, "the submitter's first chunk", every=0.02)
    if sub.poll() is None:
        sub.send_signal(signal.SIGKILL)
        sub.wait(10)
        run.notes.append("the submitter was killed mid-batch and run again")
        sub = submitter(run.backend.url, batch, log)
    for n in range(size.rounds):
        await run.sleep(run.rng.uniform(0.2, 0.8))
        victim = run.experts.pick()
        run.fault("kill -9 mid-write", (victim.name,))
        run.experts.kill(victim, signal.SIGKILL)
        verdict = integrity(_path(run))
        if verdict != "ok":
            run.problems.append(f"integrity_check after kill {n + 1}: {verdict}")
        run.experts.start(run.experts.replacement_name(victim.name), concurrency=16)
    if sub.wait(120) != 0:
        run.problems.append(f"the submitter failed: {log.read_text()[-1000:]}")
    await run.adopt()
    await run.until_all_done(size.pick(120, 600))
    verdict = integrity(_path(run))
    run.notes.append(f"integrity_check after {size.rounds} kills and at the end: {verdict}")
    if verdict != "ok":
        run.problems.append(f"integrity_check at the end: {verdict}")


async def lock_held(run: Run) -> None:
    """Another process takes SQLite's write lock and keeps it for 2.5 leases: every expert's
    store calls hang; each must stop its tasks within lease + one heartbeat, and all resume
    once the lock is let go."""
    size = run.size
    specs = []
    for n in range(size.tasks):  # half wait on the store often, half never (see network)
        specs += run.specs(1, steps=20 if n % 2 else 40, step_time=0.05, every=4 if n % 2 else 40)
    await run.submit_specs(specs)
    for i in range(size.experts):
        run.experts.start(f"e{i}")
    await run.experts_up()
    for _ in range(size.rounds):
        await run.until_succeeded(await run.succeeded() + 1, 60, "progress")
        holder, locked = _take_lock(_path(run))
        if not locked:
            run.problems.append("the lock holder could not take the lock")
        fault = run.fault("write lock held elsewhere", None)
        await run.sleep(run.lease * 2.5)
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(10)
        holder.stdout.close()
        run.heal(fault)
        run.check_stopped_in_time(fault)
    await run.until_all_done(size.pick(120, 600))


def _take_lock(path: Path) -> tuple[subprocess.Popen[str], bool]:
    """A process that holds *path*'s write lock until its stdin closes; and whether it got it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    return holder, holder.stdout.readline().strip() == "locked"


_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


def _fill(folder: Path) -> Path:
    """Write a file into *folder* until the file system is full."""
    filler = folder / "filler"
    chunk = b"\0" * (1 << 16)
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    with contextlib.suppress(OSError), filler.open("ab", buffering=0) as out:
        while True:  # the last few bytes, too
            out.write(b"\0" * 512)
    return filler


async def disk_full(run: Run) -> None:
    """The store's file system (a small tmpfs) fills up in the middle of a run: expert writes
    fail with a clear error and nothing is corrupted; a submission is refused with a clear
    message and changes nothing; once space is back everything finishes."""
    size = run.size
    folder = _path(run).parent
    await run.submit(size.tasks, steps=6, step_time=0.02, every=2)
    for i in range(size.experts):
        run.experts.start(f"e{i}")
    await run.experts_up()
    await run.until_succeeded(size.tasks // 5, 60, "a fifth of the work")
    fault = run.fault("disk full (tmpfs)", None, interrupts=False)
    filler = _fill(folder)
    before = await run.counts()
    batch = run.workdir / "late.jsonl"
    # More than the whole tmpfs holds: a small batch may fit in WAL pages a checkpoint freed
    # and land (the run before this one saw 50 tasks do so), which is right but proves nothing.
    # This one must grow the WAL past the disk, fail, and roll back whole.
    batch.write_text('{"args": [1, 1, 0, 1]}\n' * 100_000)
    refused = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "contend",
            "submit",
            "contend.testing.chaos.workload:app",
            "step",
            "--store",
            run.backend.url,
            "--batch",
            str(batch),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    await run.sleep(run.lease * 1.5)
    after = await run.counts()
    full_text = refused.stderr.strip().splitlines()[-1:] or [""]
    run.notes.append(f"submit on a full disk: exit {refused.returncode}: {full_text[0][:200]}")
    if refused.returncode == 0:
        run.problems.append("a submission on a full disk succeeded")
    elif "Traceback" in refused.stderr or "full" not in refused.stderr:
        run.problems.append(f"submit on a full disk, no clear error: {refused.stderr[-1500:]}")
    if sum(after.values()) != sum(before.values()):
        run.problems.append(f"the refused submission changed the store: {before} -> {after}")
    logs = run.experts.logs()
    if "full" not in logs:
        run.problems.append("no expert said the disk is full")
    if "Traceback" in logs:
        run.problems.append("an expert logged a traceback on a full disk")
    verdict = integrity(_path(run))
    if verdict != "ok":
        run.problems.append(f"integrity_check on the full disk: {verdict}")
    filler.unlink()
    run.heal(fault)
    await run.until_all_done(size.pick(120, 600))
    verdict = integrity(_path(run))
    if verdict != "ok":
        run.problems.append(f"integrity_check after the disk had room again: {verdict}")


def mount_tmpfs(folder: Path, megabytes: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def unmount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def can_mount() -> str | None:
    return None if os.geteuid() == 0 else "a tmpfs of its own needs root"
