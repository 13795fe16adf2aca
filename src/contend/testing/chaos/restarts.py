"""The store's server crashes in the middle of a run and comes back: PostgreSQL stopped with
``pg_ctl -m immediate`` (every backend dies at once, the server recovers from its WAL), etcd
killed with kill -9 and started again on the same data. Each outage is either shorter than the
lease (experts ride it out) or longer (every expert loses its lease, stops its tasks, commits
nothing of them and opens a new session when the server is back)."""

from __future__ import annotations

import asyncio

from contend.testing.chaos.scenario import Run


async def restart(run: Run) -> None:
    size = run.size
    await run.submit(size.tasks, steps=10, step_time=0.05, every=2)
    for i in range(size.experts):
        run.experts.start(f"e{i}")
    await run.experts_up()
    await run.until_succeeded(1, 60, "the first task to succeed")
    for n in range(size.rounds):
        await run.sleep(run.rng.uniform(1.0, 2.0))
        down = run.lease * (0.4 if n % 2 else 1.8)  # shorter, then longer, than the lease
        kind = f"{run.backend.name} crash ({down:.1f}s down)"
        fault = run.fault(kind, None, interrupts=False)
        await asyncio.to_thread(run.backend.crash)
        await run.sleep(down)
        await asyncio.to_thread(run.backend.start_again)
        run.heal(fault)
        done = await run.retrying(run.succeeded, 60, "the store to answer again")
        await run.until_succeeded(done + 1, 60, f"progress after {kind}")
    await run.until_all_done(size.pick(180, 600))
    logs = run.experts.logs()
    if size.rounds and "lost its lease" not in logs:
        run.problems.append("no expert lost its lease: no outage outlasted the lease")
