"""Periodic tasks: schedules, catch-up, tick keys, and the ticker on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from contend import App
from contend.domain.periodic import MAX_CATCH_UP, Schedule, tick_key, tick_time
from contend.errors import ConfigError
from contend.runtime.ticker import Ticker
from contend.store.memory import MemoryStore
from contend.testing import FakeClock

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a whole minute


def test_intervals_are_aligned_to_the_epoch() -> None:
    s = Schedule.build(every=60)
    assert s.after(T0) == T0 + 60
    assert s.after(T0 + 0.5) == T0 + 60
    assert s.after(T0 - 0.5) == T0
    assert s.ticks(T0, T0 + 180) == [T0 + 60, T0 + 120, T0 + 180]
    assert s.ticks(T0, T0 + 59) == []


def test_cron_expressions_tick_in_their_time_zone() -> None:
    s = Schedule.build(cron="*/15 * * * *")
    assert s.ticks(T0, T0 + 3600) == [T0 + 900 * n for n in range(1, 5)]
    # 09:00 in Berlin is 08:00 UTC in January
    berlin = Schedule.build(cron="0 9 * * *", tz="Europe/Berlin")
    assert berlin.after(T0 - 1) == T0
    assert tick_time(T0) == "2027-01-15T08:00:00Z"


def test_catch_up_policies() -> None:
    now = T0 + 300
    assert Schedule.build(every=60, catch_up="skip").missed(T0, now) == []
    assert Schedule.build(every=60).missed(T0, now) == [now]  # latest, the default
    assert Schedule.build(every=60, catch_up="all").missed(T0, now) == [
        T0 + 60 * n for n in range(1, 6)
    ]
    # nothing older than the window, and never more than MAX_CATCH_UP
    windowed = Schedule.build(every=60, catch_up="all", catch_up_window=120)
    assert windowed.missed(T0, now) == [now - 60, now]
    many = Schedule.build(every=1, catch_up="all").missed(T0 - 5000, T0)
    assert len(many) == MAX_CATCH_UP and many[-1] == T0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "one of every"),
        ({"every": 60, "cron": "* * * * *"}, "one of every"),
        ({"every": 0}, "every must be"),
        ({"every": 1.5}, "whole number"),
        ({"every": True}, "every must be"),
        ({"every": float("nan")}, "every must be"),
        ({"cron": "every minute"}, "not a cron expression"),
        ({"cron": "61 * * * *"}, "not a cron expression"),
        ({"every": 60, "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 60, "catch_up": "some"}, "catch_up must be one of"),
        ({"every": 60, "catch_up_window": -1}, "catch_up_window"),
    ],
)
def test_bad_schedules_are_refused_with_the_reason(kwargs: dict[str, object], match: str) -> None:
    app = App("memory://")
    with pytest.raises(ConfigError, match=match):
        app.periodic(**kwargs)  # type: ignore[arg-type]
    assert app.tasks == {} and app.schedules == {}


def test_a_periodic_task_takes_no_arguments_but_ctx_and_tick() -> None:
    app = App("memory://")

    @app.periodic(every=60)
    async def fine(ctx: object, tick: str) -> str:
        return tick

    assert app.schedules["fine"].wants_tick
    with pytest.raises(ConfigError, match="must take no arguments"):

        @app.periodic(every=60)
        async def needs_one(n: int) -> None:
            pass

    assert "needs_one" not in app.tasks and "needs_one" not in app.schedules
    assert tick_key("fine", T0) == "periodic:fine:2027-01-15T08:00:00Z"


@pytest.fixture
async def world() -> AsyncIterator[tuple[App, MemoryStore, FakeClock]]:
    clock = FakeClock(T0 + 10)
    store = MemoryStore(clock=clock)
    await store.open()
    app = App("memory://", store_factory=lambda url: store)

    @app.periodic(every=60)
    async def beat(tick: str) -> str:
        return tick

    yield app, store, clock
    await store.close()


async def _ticks(store: MemoryStore) -> list[str]:
    return sorted(str(t.kwargs["tick"]) for t in await store.list_tasks(limit=10_000))


async def test_each_tick_is_one_task_however_many_tickers(
    world: tuple[App, MemoryStore, FakeClock],
) -> None:
    app, store, clock = world
    stopping = asyncio.Event()
    tickers = [Ticker(app, store, f"e{n}", clock=clock, stopping=stopping) for n in range(3)]
    runs = [asyncio.create_task(t.run()) for t in tickers]
    await clock.run(60 * 3)
    stopping.set()
    await asyncio.gather(*runs)
    # the catch-up tick (T0, the latest before the start) and three on time, once each
    assert await _ticks(store) == [tick_time(T0 + 60 * n) for n in range(4)]
    created = sorted(t for ticker in tickers for t in ticker.created.get("beat", []))
    assert created == await _ticks(store)  # each tick created by exactly one ticker


async def test_a_stall_catches_up_by_the_policy(
    world: tuple[App, MemoryStore, FakeClock],
) -> None:
    app, store, clock = world
    app.schedules["beat"] = app.schedules["beat"].__class__(
        "beat", Schedule.build(every=60, catch_up="all", catch_up_window=240), True
    )
    stopping = asyncio.Event()
    ticker = Ticker(app, store, "e", clock=clock, stopping=stopping)
    run = asyncio.create_task(ticker.run())
    await clock.run(1)
    clock.value += 300  # the process was paused for five minutes: no sleeper woke
    await clock.run(1)
    stopping.set()
    await run
    # at the start, the ticks of the last 240 s (T0 and the three before it); after the
    # stall, those of the five minutes within the window, and the one on time
    assert await _ticks(store) == [tick_time(T0 + 60 * n) for n in range(-3, 6) if n != 1]


async def test_a_failing_store_is_retried_until_the_tick_lands(
    world: tuple[App, MemoryStore, FakeClock],
) -> None:
    app, store, clock = world
    from contend.errors import StoreError

    real = store.submit
    fails = [2]

    async def flaky(specs: object) -> object:
        if fails[0]:
            fails[0] -= 1
            raise StoreError("the store is down")
        return await real(specs)  # type: ignore[arg-type]

    store.submit = flaky  # type: ignore[method-assign]
    stopping = asyncio.Event()
    run = asyncio.create_task(Ticker(app, store, "e", clock=clock, stopping=stopping).run())
    await clock.run(5)
    stopping.set()
    await run
    assert fails == [0]
    assert await _ticks(store) == [tick_time(T0)]


async def test_a_tick_a_moment_late_still_runs_under_latest(
    world: tuple[App, MemoryStore, FakeClock],
) -> None:
    # a busy host wakes the ticker 1.5 s late for a one-second tick: both ticks run
    app, store, clock = world
    app.schedules["beat"] = app.schedules["beat"].__class__("beat", Schedule.build(every=1), True)
    stopping = asyncio.Event()
    run = asyncio.create_task(Ticker(app, store, "e", clock=clock, stopping=stopping).run())
    await clock.run(0.1)
    clock.value += 2.4  # nobody woke at T0+11
    await clock.run(0.1)
    stopping.set()
    await run
    assert await _ticks(store) == [tick_time(T0 + n) for n in (10, 11, 12)]
