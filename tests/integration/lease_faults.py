"""Shared by the lease-under-faults tests of every backend: a task whose side effects are logged
with timestamps, experts run in this process, and the checks on what the log shows.

A run of ``work`` appends ``(expert, fence, time)`` every TICK seconds while it runs, and
``(expert, fence, time)`` to ``stops`` when it ends, however it ends. Its first attempt runs
for a long time (longer than any fault); later attempts finish at once, so that a task taken
over after a fault ends and commits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from contend import App, Expert, TaskContext

LEASE = 2.0
HEARTBEAT = LEASE / 3  # the default: a third of the lease
#: An expert must have stopped its tasks this long after the store stopped answering it.
STOP_WITHIN = LEASE + HEARTBEAT
#: How long a fault is held at most (the issue's trials held 6-12 s); the tests heal earlier
#: once they have seen what they wait for.
FAULT = 9.0
TICK = 0.02


@dataclass
class SideEffects:
    ticks: list[tuple[str, int, float]] = field(default_factory=list)
    stops: list[tuple[str, int, float]] = field(default_factory=list)

    def of(self, expert: str) -> list[float]:
        return [t for e, _, t in self.ticks if e == expert]

    def stopped(self, expert: str) -> float | None:
        return next((t for e, _, t in self.stops if e == expert), None)

    def started(self, expert: str) -> bool:
        return bool(self.of(expert))


def make_app(url: str, effects: SideEffects) -> App:
    app = App(url)

    @app.task(retries=5)
    async def work(ctx: TaskContext, seconds: float) -> str:
        end = time.monotonic() + (seconds if ctx.attempt == 1 else 0.0)
        try:
            while True:
                effects.ticks.append((ctx.expert, ctx.fence, time.monotonic()))
                if time.monotonic() >= end:
                    return ctx.expert
                await asyncio.sleep(TICK)  # one step of work with a side effect
        finally:
            effects.stops.append((ctx.expert, ctx.fence, time.monotonic()))

    return app


@asynccontextmanager
async def expert(app: App, name: str, **config: Any) -> AsyncIterator[Expert]:
    """Run an expert (lease LEASE unless told) until the block ends; then stop it."""
    config.setdefault("lease_ttl", LEASE)
    config.setdefault("concurrency", 1)
    e = Expert(app, name=name, **config)
    runner = asyncio.create_task(e.run())
    started = asyncio.create_task(e.started.wait())
    done, _ = await asyncio.wait({runner, started}, return_when=asyncio.FIRST_COMPLETED)
    if runner in done:
        started.cancel()
        runner.result()
    try:
        yield e
    finally:
        e.config.grace = 0
        e.stop()
        await asyncio.wait_for(runner, 60)


async def until(check: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll *check* (every 10 ms) until it holds; fail after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.01)


async def hold_fault(effects: SideEffects, victim: str, rival: str | None = None) -> None:
    """Keep a fault on until *victim* stopped its run (and *rival* started one) and a whole
    lease has passed since the fault began, or FAULT seconds at most: longer than the lease
    either way, never for ever on a runtime that does not stop."""
    began = time.monotonic()

    def seen() -> bool:
        return (
            effects.stopped(victim) is not None
            and (rival is None or effects.started(rival))
            and time.monotonic() - began > LEASE + HEARTBEAT
        )

    try:
        await until(seen, FAULT, "the fault's effects")
    except AssertionError:
        pass  # held for FAULT seconds: the checks after it say what went wrong


async def stop_time(effects: SideEffects, victim: str, fault_at: float) -> float:
    """Seconds from the fault to *victim*'s stop (waiting for it a while after the fault was
    healed, so that a runtime that stops only then is measured too)."""
    await until(lambda: effects.stopped(victim) is not None, 30, f"{victim} stopping its run")
    stopped = effects.stopped(victim)
    assert stopped is not None
    return stopped - fault_at


def assert_no_overlap(effects: SideEffects, old: str, new: str) -> None:
    """The old owner's last side effect comes before the new owner's first: two executions of
    the task never overlapped."""
    last_old, first_new = max(effects.of(old)), min(effects.of(new))
    assert last_old < first_new, (
        f"{old} ran until {last_old:.3f}, {new} from {first_new:.3f}: "
        f"{last_old - first_new:.2f}s of overlap"
    )


async def frozen_path_run(url: str, default_port: int, label: str) -> None:
    """The frozen-path scenario on the store at *url*: an expert reaches it through a proxy that
    stops forwarding (packets vanish, no reset) while a rival keeps a direct path. The frozen
    expert must stop its task within lease + one heartbeat, the rival run it after, the two
    runs never overlap, and only the rival's result be committed."""
    from urllib.parse import urlsplit

    from contend.testing.proxy import FaultProxy

    where = urlsplit(url)
    proxy = FaultProxy(where.hostname or "127.0.0.1", where.port or default_port).start()
    effects = SideEffects()
    frozen_app, direct_app = make_app(proxy.url(url), effects), make_app(url, effects)
    try:
        async with expert(frozen_app, "frozen") as frozen:
            handle = await frozen_app.submit("work", [60.0])
            await until(lambda: effects.started("frozen"), 10, "the first run")
            async with expert(direct_app, "rival") as rival:
                proxy.freeze()
                frozen_at = time.monotonic()
                try:
                    await hold_fault(effects, "frozen", rival="rival")
                finally:
                    proxy.unfreeze()  # what was held now reaches the store, too late
                stopped = await stop_time(effects, "frozen", frozen_at)
                await until(lambda: effects.started("rival"), 30, "the rival's run")
                took_over = min(effects.of("rival")) - frozen_at
                print(
                    f"\n{label}, path frozen: stopped after {stopped:.2f}s, "
                    f"the rival ran it from {took_over:.2f}s"
                )
                assert stopped <= STOP_WITHIN, f"ran {stopped:.2f}s into the freeze"
                assert_no_overlap(effects, "frozen", "rival")
                assert await asyncio.wait_for(handle.result(), 30) == "rival"
                # the result is visible once the store has it, a moment before the rival
                # counts its commit
                await until(lambda: rival.stats.tasks_done == 1, 10, "the rival's count")
                assert frozen.stats.tasks_done == 0
        events = (await (await direct_app.store()).get(handle.id, history=True)).history
        assert [e.expert for e in events if e.event == "succeeded"] == ["rival"]
    finally:
        await frozen_app.aclose()
        await direct_app.aclose()
        proxy.close()
