"""The chaos suite's task types, run by real ``contend expert`` processes.

``contend expert contend.testing.chaos.workload:app`` runs them. Each run writes its side
effects to a log of its own process (``$CONTEND_CHAOS_EFFECTS/<expert>.<pid>.jsonl``), one JSON
object a line, each stamped with this host's monotonic clock (``m``, shared by every process on
the host, whatever its wall clock does) and its wall clock (``w``):

* ``start`` — a run begins (task ``t``, fence ``f``, expert ``e``, attempt ``a``, the step ``i``
  it resumes from);
* ``tick`` — one step's side effect, written only after ``ctx.check()`` said the run may go on,
  as a careful task does before an effect outside the store (``c``: the monotonic time just
  after that check; a pause between the check and the write makes ``m`` much later);
* ``ckpt`` — a checkpoint the store acknowledged;
* ``done`` — the run produced its result (committing it is the runtime's business);
* ``stop`` — the run ended without a result (``why``: the exception; for a refused checkpoint,
  ``by``: ``store``, or ``expert`` when the runtime held it back, its lease no longer safe);
* ``zombie`` — after its run was stopped, the process wrote to the store directly with the old
  fence once a newer owner held the task (``write``: checkpoint or complete; ``refused``: true
  when the store said FencedOut). A stale owner's write that lands is a bug.

The result of ``step(seed, steps, …)`` is a pure function of its arguments (:func:`expected`)
computed step by step through checkpoints, so a run resumed from a wrong checkpoint gives a
wrong result.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from contend import App, TaskContext
from contend.errors import ContendError, FencedOut
from contend.store.port import Completion

EFFECTS_ENV = "CONTEND_CHAOS_EFFECTS"
#: Attempts per task: a task may be interrupted by many faults in a row and must still finish.
ATTEMPTS = 100
MOD = 2**52  # results stay exact in every JSON reader
#: How long a stopped run's zombie waits for a newer owner before it gives up, seconds.
ZOMBIE_PATIENCE = 60.0

app = App()


def mix(acc: int, seed: int, i: int) -> int:
    return (acc * 1_000_003 + seed * 7 + i) % MOD


def expected(seed: int, steps: int) -> dict[str, int]:
    """What ``step(seed, steps, …)`` returns, however many owners it had."""
    acc = seed
    for i in range(steps):
        acc = mix(acc, seed, i)
    return {"acc": acc, "steps": steps}


class EffectLog:
    """This process's side-effect log (appends of whole lines; O_APPEND keeps them apart)."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def write(self, kind: str, ctx: TaskContext, **fields: Any) -> None:
        if self._fd is None:
            folder = os.environ.get(EFFECTS_ENV)
            if not folder:
                return  # run outside the suite: no log
            path = os.path.join(folder, f"{ctx.expert}.{os.getpid()}.jsonl")
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        line = {
            "k": kind,
            "t": ctx.task_id,
            "f": ctx.fence,
            "e": ctx.expert,
            "m": time.monotonic(),
            "w": time.time(),
            **fields,
        }
        os.write(self._fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())


effects = EffectLog()
_zombies: set[asyncio.Task[None]] = set()


@app.task(retries=ATTEMPTS - 1)
async def step(
    ctx: TaskContext, seed: int, steps: int, step_time: float = 0.0, every: int = 1
) -> dict[str, int]:
    """*steps* steps of *step_time* seconds, each a side effect; a checkpoint every *every*
    steps. Resumes from the last checkpoint."""
    state = ctx.state if isinstance(ctx.state, dict) else {"i": 0, "acc": seed}
    i, acc = int(state["i"]), int(state["acc"])
    effects.write("start", ctx, a=ctx.attempt, i=i)
    try:
        while i < steps:
            if step_time:
                await asyncio.sleep(step_time)
            ctx.check()  # may this run still act? (a lease lost, a pause past it)
            checked = time.monotonic()
            acc, i = mix(acc, seed, i), i + 1
            effects.write("tick", ctx, i=i, c=checked)
            if i % every == 0 and i < steps:
                await ctx.checkpoint({"i": i, "acc": acc})
                effects.write("ckpt", ctx, i=i)
    except FencedOut as exc:  # a checkpoint refused: by the store, or held back by the runtime
        own = exc.detail.startswith(("this expert's lease", "this run was stopped"))
        effects.write("stop", ctx, why="FencedOut", by="expert" if own else "store")
        _haunt(ctx, {"i": i, "acc": acc})
        raise
    except BaseException as exc:
        effects.write("stop", ctx, why=type(exc).__name__)
        _haunt(ctx, {"i": i, "acc": acc})
        raise
    effects.write("done", ctx)
    return {"acc": acc, "steps": steps}


def _haunt(ctx: TaskContext, state: dict[str, int]) -> None:
    """Leave a zombie behind the stopped run: it writes with the old fence once a newer owner
    has the task, and logs what the store said."""
    try:
        zombie = asyncio.get_running_loop().create_task(_zombie(ctx, state))
    except RuntimeError:
        return
    _zombies.add(zombie)
    zombie.add_done_callback(_zombies.discard)


async def _zombie(ctx: TaskContext, state: dict[str, int]) -> None:
    store = await app.store()
    give_up = time.monotonic() + ZOMBIE_PATIENCE
    while True:
        try:
            task = await asyncio.wait_for(store.get(ctx.task_id), 5.0)
            if task.fence > ctx.fence or task.state.terminal:
                break
        except (ContendError, TimeoutError):
            pass  # the store may be out of reach for a while: that is the point
        if time.monotonic() > give_up:
            effects.write("zombie", ctx, write="none", refused=None)
            return
        await asyncio.sleep(0.2)
    try:
        await store.checkpoint(ctx.expert, ctx.task_id, ctx.fence, json.dumps(state))
    except FencedOut as exc:
        effects.write("zombie", ctx, write="checkpoint", refused=True, reason=exc.reason)
    except ContendError as exc:
        effects.write("zombie", ctx, write="checkpoint", refused=None, error=str(exc)[:200])
    else:
        effects.write("zombie", ctx, write="checkpoint", refused=False)
    result = json.dumps({"acc": -1, "steps": -1, "zombie": ctx.expert})
    try:
        (refusal,) = await store.complete(ctx.expert, [Completion(ctx.task_id, ctx.fence, result)])
    except ContendError as exc:
        effects.write("zombie", ctx, write="complete", refused=None, error=str(exc)[:200])
        return
    reason = refusal.reason if isinstance(refusal, FencedOut) else None
    effects.write("zombie", ctx, write="complete", refused=refusal is not None, reason=reason)
