"""Killed and paused experts: kill -9 of random experts with replacements started, and SIGSTOP
past the lease followed by SIGCONT."""

from __future__ import annotations

import signal

from contend.testing.chaos.scenario import Run


async def kill_9(run: Run) -> None:
    """Kill a random expert with SIGKILL, start a replacement, again and again, over 1,000+
    tasks that checkpoint at every step; then let everything finish."""
    size = run.size
    await run.submit(size.tasks, steps=5, step_time=0.05, every=1)
    for i in range(size.experts):
        run.experts.start(f"e{i}")
    await run.experts_up()
    await run.until_succeeded(1, 60, "the first task to succeed")
    for _ in range(size.rounds):
        await run.sleep(run.rng.uniform(0.5, 2.0))
        victim = run.experts.pick()
        run.fault("kill -9", (victim.name,))
        run.experts.kill(victim, signal.SIGKILL)
        run.experts.start(run.experts.replacement_name(victim.name))
    await run.until_all_done(run.size.pick(120, 600))


async def sigstop(run: Run) -> None:
    """SIGSTOP an expert in the middle of its tasks for longer than its lease, SIGCONT it once
    others have taken its tasks over: it must notice at once, stop them and commit nothing of
    them (its late writes are refused)."""
    size = run.size
    await run.submit(size.tasks, steps=20, step_time=0.05, every=4)
    for i in range(size.experts):
        run.experts.start(f"e{i}")
    await run.experts_up()
    await run.until_succeeded(1, 60, "the first task to succeed")
    for _ in range(size.rounds):
        victim = run.experts.pick()
        run.fault("SIGSTOP", (victim.name,))
        run.experts.kill(victim, signal.SIGSTOP)
        await run.sleep(run.lease * 2.5)  # past the lease: rivals expire and claim its tasks
        before = victim.text().count("lost its lease")
        run.experts.kill(victim, signal.SIGCONT)

        async def noticed(victim_log: str = victim.name, before: int = before) -> bool:
            return run.experts.procs[victim_log].text().count("lost its lease") > before

        try:
            took = await run.until(noticed, 10, f"{victim.name} to notice its lost lease")
        except AssertionError as exc:
            run.problems.append(str(exc))
        else:
            if took > run.lease:
                run.problems.append(
                    f"{victim.name} noticed its lost lease {took:.2f}s after SIGCONT"
                )
            run.notes.append(f"{victim.name} noticed {took:.2f}s after SIGCONT")
        await run.sleep(run.rng.uniform(0.5, 1.5))
    await run.until_all_done(run.size.pick(120, 600))
