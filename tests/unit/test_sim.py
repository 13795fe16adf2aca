"""The placement simulator and the memory store's pending index it leans on."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random

import pytest

from contend.domain.scoring import ExpertView, TaskView, default_fitness, speed_fitness
from contend.domain.task import Capabilities, Requirements, TaskSpec, TaskState
from contend.sim import STRATEGIES, Job, Kind, Scenario, SimConfig, SimExpert, simulate
from contend.sim.scenario import make_scenario
from contend.store.memory import MemoryStore
from contend.store.port import Completion, ExpertInfo, Failure
from contend.testing.clock import FakeClock

# -- the simulator -------------------------------------------------------------------------


def _outcome(strategy: str, seed: int, scenario: Scenario) -> dict[str, object]:
    out = simulate(scenario, strategy, SimConfig(seed=seed)).to_json()
    del out["wall_seconds"], out["cpu_seconds"], out["work_cpu_seconds"]
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_seed_gives_the_same_run(strategy: str) -> None:
    scenario = make_scenario(8, 300, arrival="stream", seed=3)
    assert scenario == make_scenario(8, 300, arrival="stream", seed=3)
    first = _outcome(strategy, 5, scenario)
    assert first == _outcome(strategy, 5, scenario)
    assert first["tasks"] == first["claims_won"] == 300


def test_another_seed_gives_another_scenario() -> None:
    assert make_scenario(8, 300, seed=1).jobs != make_scenario(8, 300, seed=2).jobs


def _tiny() -> Scenario:
    """A is four times faster at x than B; three x tasks of base 4 arrive at once."""
    kinds = {"x": Kind("x", base=4.0)}
    experts = (SimExpert("a", speed={"x": 4.0}), SimExpert("b"))
    jobs = tuple(Job(f"t{n}", "x", 0.0) for n in range(3))
    return Scenario("tiny", kinds, experts, jobs)


def test_fifo_on_a_tiny_scenario() -> None:
    # a takes t0 (done at 1) and b t1 (done at 4); a, free again at 1, takes t2 (done at 2)
    r = simulate(_tiny(), "fifo")
    assert r.makespan == pytest.approx(4.0)
    assert r.mean_completion == pytest.approx((1 + 4 + 2) / 3)
    assert (r.claim_attempts, r.lost_races) == (3, 0)


def test_greedy_on_a_tiny_scenario() -> None:
    # earliest finish: every task on a, one after the other, at 1, 2 and 3
    r = simulate(_tiny(), "greedy")
    assert r.makespan == pytest.approx(3.0)
    assert r.mean_completion == pytest.approx(2.0)


def test_gpu_tasks_only_run_on_gpu_experts() -> None:
    kinds = {"g": Kind("g", base=1.0, gpu=True), "c": Kind("c", base=1.0)}
    experts = (SimExpert("cpu", slots=4), SimExpert("gpu", gpu=True))
    jobs = tuple(Job(f"t{n}", "g" if n % 2 else "c", 0.0) for n in range(6))
    for strategy in STRATEGIES:
        r = simulate(Scenario("gpu", kinds, experts, jobs), strategy)
        # three g tasks of 1 s on one gpu slot: never sooner than 3 s
        assert r.makespan >= 3.0 - 1e-9, strategy
        assert r.claims_won == 6


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cpu_experts_keep_working_behind_a_head_of_gpu_tasks(strategy: str) -> None:
    kinds = {"g": Kind("g", base=1.0, gpu=True), "c": Kind("c", base=1.0)}
    experts = (SimExpert("gpu", gpu=True), SimExpert("cpu-0"), SimExpert("cpu-1"))
    jobs = tuple(Job(f"t{n:02d}", "g" if n < 40 else "c", 0.0) for n in range(50))
    r = simulate(Scenario("gpu head", kinds, experts, jobs), strategy)
    # 40 s of gpu work on one slot; the cpu experts take the 10 cpu tasks meanwhile
    assert 40.0 - 1e-9 <= r.makespan < 40.0 + 40 * SimConfig().window + 1.0


def _two_specialists() -> Scenario:
    """a is four times faster at x, b at y; a y task is older than an x task."""
    kinds = {"x": Kind("x", base=4.0), "y": Kind("y", base=4.0)}
    experts = (SimExpert("a", speed={"x": 4.0}), SimExpert("b", speed={"y": 4.0}))
    return Scenario("pair", kinds, experts, (Job("t0", "y", 0.0), Job("t1", "x", 0.0)))


def test_real_experts_each_take_the_task_they_are_fastest_at() -> None:
    # fifo: the first idle expert takes the oldest task, whatever it is good at
    assert simulate(_two_specialists(), "fifo").makespan == pytest.approx(4.0)
    for strategy in ("race", "race-nojitter", "auction"):
        r = simulate(_two_specialists(), strategy)
        assert r.makespan == pytest.approx(1.0, abs=0.2), strategy  # both at speed 4
        assert r.claims_won == 2


def test_the_race_delay_is_the_real_experts() -> None:
    # b is four times slower at x than a: it waits window × (1 − its relative fitness) before
    # it claims the task a cannot take yet; a longer window delays it by more
    quick = simulate(_tiny(), "race-nojitter", SimConfig(window=0.0))
    slow = simulate(_tiny(), "race-nojitter", SimConfig(window=2.0))
    assert quick.makespan == pytest.approx(4.0)  # no race: b claims at once
    assert 4.0 + 0.5 < slow.makespan < 4.0 + 2.0


def test_counters_come_from_the_experts_and_the_store() -> None:
    scenario = make_scenario(6, 120, seed=2)
    race = simulate(scenario, "race")
    assert race.claims_won == 120 and race.bids == 0
    assert race.claim_calls >= 1 and race.claim_attempts >= race.claims_won
    assert race.lost_races == race.claim_attempts - race.claims_won
    assert race.success == race.claims_won / race.claim_attempts
    assert race.to_json()["success"] == round(race.success, 4)
    auction = simulate(scenario, "auction")
    assert auction.claims_won == 120 and auction.bids >= 120  # every task bid on


def test_the_work_cpu_leaves_the_clusters_start_and_stop_out() -> None:
    # 60 experts and 6 tasks: starting, warming up and stopping 60 experts costs per expert;
    # the work phase (first arrival to last completion) is a part of the run's CPU time
    race = simulate(make_scenario(60, 6, seed=3), "race")
    assert 0 < race.work_cpu_seconds < race.cpu_seconds
    fifo = simulate(make_scenario(60, 6, seed=3), "fifo")  # modelled: all of it is work
    assert fifo.work_cpu_seconds == fifo.cpu_seconds


@pytest.mark.parametrize("arrival", ["batch", "stream"])
def test_experts_that_waited_claim_no_task_a_fitter_rival_took(arrival: str) -> None:
    # every idle expert peeks at the same moment; the fittest claims at once and the others
    # after their delay, which found the tasks gone: 1.15 (batch) and 1.29 (stream) claim
    # attempts per task before the late check, 1.00 with it, the placement the same
    scenario = make_scenario(10 if arrival == "stream" else 20, 200, arrival=arrival, seed=1)
    race = simulate(scenario, "race", SimConfig(window=0.05, jitter=0.1))
    assert race.claims_won == 200
    assert race.claim_attempts <= 1.02 * 200, race.claim_attempts
    greedy = simulate(scenario, "greedy")
    assert race.makespan <= 1.15 * greedy.makespan, (race.makespan, greedy.makespan)


def test_a_task_nobody_can_run_is_reported() -> None:
    kinds = {"g": Kind("g", base=1.0, gpu=True)}
    scenario = Scenario("no gpu", kinds, (SimExpert("cpu"),), (Job("t0", "g", 0.0),))
    with pytest.raises(RuntimeError, match="never ran"):
        simulate(scenario, "race")


def test_speed_fitness_prefers_the_faster_expert() -> None:
    task = TaskView("t", "x", "default", 0, Requirements(), 0.0)
    speeds = {"fast": 4.0, "slow": 1.0}
    fit = speed_fitness(lambda e, t: speeds[e.name], fastest=4.0)
    fast, slow = ExpertView("fast"), ExpertView("slow")
    assert fit(fast, task) == default_fitness(fast, task)
    assert fit(slow, task) == pytest.approx(fit(fast, task) / 4)


# -- the memory store's index --------------------------------------------------------------


async def _store() -> tuple[MemoryStore, FakeClock, str]:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    session = await store.register_expert(ExpertInfo("e"), 60.0)
    return store, clock, session


def _spec(tid: str, priority: int = 0, gpu: bool = False, delay: float = 0.0) -> TaskSpec:
    spec = TaskSpec.build(
        "t", priority=priority, requirements=["gpu"] if gpu else None, delay=delay
    )
    return dataclasses.replace(spec, id=tid)


GPU = Capabilities(frozenset({"gpu"}))
CPU = Capabilities()


async def test_claims_by_priority_then_age_with_requirements_filtered() -> None:
    store, clock, session = await _store()
    await store.submit([_spec("a"), _spec("b", priority=5, gpu=True)])
    clock.advance(1)
    await store.submit([_spec("c", priority=5), _spec("d"), _spec("e", priority=9, delay=10)])
    assert [v.id for v in await store.peek(["default"], CPU, 10)] == ["c", "a", "d"]
    assert [v.id for v in await store.peek(["default"], GPU, 10)] == ["b", "c", "a", "d"]
    assert [v.id for v in await store.peek(["default"], GPU, 2)] == ["b", "c"]
    assert await store.next_due(["default"]) == pytest.approx(clock() - 1)
    got = await store.claim("e", session, ["default"], CPU, limit=2, lease_ttl=60)
    assert [c.id for c in got] == ["c", "a"]
    clock.advance(10)  # e is due now and jumps the queue
    assert [v.id for v in await store.peek(["default"], GPU, 10)] == ["e", "b", "d"]
    assert await store.peek(["other"], GPU, 10) == []


async def test_the_index_follows_every_move_back_to_pending() -> None:
    store, clock, session = await _store()
    await store.submit([_spec(t) for t in "abcd"])
    got = await store.claim("e", session, ["default"], CPU, limit=3, lease_ttl=60)
    a, b, c = got
    await store.release("e", [(a.id, a.fence)])  # back at once, in its old place
    await store.fail("e", [Failure(b.id, b.fence, '"boom"', retry_delay=5.0)])
    await store.complete("e", [Completion(c.id, c.fence, "null")])
    await store.cancel("d")
    assert [v.id for v in await store.peek(["default"], CPU, 10)] == ["a"]
    clock.advance(5)
    assert [v.id for v in await store.peek(["default"], CPU, 10)] == ["a", "b"]
    await store.retry("d")
    assert [v.id for v in await store.peek(["default"], CPU, 10)] == ["a", "b", "d"]
    got = await store.claim("e", session, ["default"], CPU, limit=1, lease_ttl=1)
    assert [g.id for g in got] == ["a"]
    clock.advance(2)  # a's lease lapses: expire returns it to pending
    assert await store.expire() == 1
    assert [v.id for v in await store.peek(["default"], CPU, 10)] == ["a", "b", "d"]


async def test_the_index_agrees_with_a_full_scan() -> None:
    """Random submissions, claims, failures and releases; after each step the indexed peek
    equals the order a scan of every pending task gives."""
    rng = random.Random(7)
    store, clock, session = await _store()
    held: list[tuple[str, int]] = []
    for step in range(300):
        op = rng.random()
        if op < 0.4:
            specs = [
                _spec(
                    f"s{step}-{n}",
                    priority=rng.choice((0, 0, 1, 5)),
                    gpu=rng.random() < 0.3,
                    delay=rng.choice((0.0, 0.0, 2.0)),
                )
                for n in range(rng.randint(1, 4))
            ]
            await store.submit(specs)
        elif op < 0.6:
            caps = rng.choice((CPU, GPU))
            got = await store.claim("e", session, ["default"], caps, limit=2, lease_ttl=60)
            held += [(c.id, c.fence) for c in got]
        elif op < 0.8 and held:
            tid, fence = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.5:
                await store.release("e", [(tid, fence)])
            else:
                await store.fail("e", [Failure(tid, fence, "null", retry_delay=1.0)])
        else:
            clock.advance(rng.choice((0.5, 1.0)))
        now = clock()
        for caps in (CPU, GPU):
            pending = await store.list_tasks(state=TaskState.PENDING, limit=100_000)
            expected = sorted(
                (t for t in pending if t.run_at <= now and caps.satisfies(t.requirements)),
                key=lambda t: (-t.priority, t.run_at, t.id),
            )
            seen = await store.peek(["default"], caps, 100_000)
            assert [v.id for v in seen] == [t.id for t in expected]
        due = [t.run_at for t in pending]
        assert await store.next_due(["default"]) == (min(due) if due else None)


def test_sorted_keys_matches_a_sorted_list() -> None:
    from contend.store._sorted import SortedKeys

    rng = random.Random(3)
    keys: SortedKeys[int] = SortedKeys()
    model: set[int] = set()
    for _ in range(5000):
        k = rng.randrange(3000)
        if k in model and rng.random() < 0.5:
            assert keys.discard(k)
            model.discard(k)
        elif k not in model:
            keys.add(k)
            model.add(k)
        else:
            assert not keys.discard(k + 10_000)
    assert list(keys.iter_from()) == sorted(model)
    assert len(keys) == len(model)
    start = sorted(model)[len(model) // 2]
    assert list(keys.iter_from(start)) == [k for k in sorted(model) if k >= start]
    assert keys.first_from(10_000) is None


async def test_the_memory_store_can_wait_for_a_change_with_no_timeout() -> None:
    # the simulator's experts wait this way and bound the wait on the virtual clock themselves
    store = MemoryStore()
    waiting = asyncio.create_task(store.wait_for_change(math.inf))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    await store.submit([TaskSpec.build("x")])
    await asyncio.wait_for(waiting, 5.0)


async def test_a_plain_tasks_end_wakes_no_idle_expert_but_a_freed_slot_does() -> None:
    # Every end woke every idle expert, which read the queue for nothing: among 200 simulated
    # experts, 244 claim rounds per task in a batch. An end that frees nothing (no limit,
    # no dependants) now wakes only those waiting for any change (a result's caller).
    store = MemoryStore()
    session = await store.register_expert(ExpertInfo("e"), 30.0)
    plain = TaskSpec.build("x")
    limited = TaskSpec.build("x", limit_key="k", concurrency_limit=1)
    after = TaskSpec.build("x", depends_on=[limited.id])
    await store.submit([plain, limited, after])
    claimed = {
        c.id: c
        for c in await store.claim(
            "e", session, ["default"], Capabilities(), limit=5, lease_ttl=30.0
        )
    }
    assert set(claimed) == {plain.id, limited.id}

    async def woken(end: TaskSpec) -> tuple[bool, bool]:
        await store.wait_for_work(0)
        await store.wait_for_change(0)
        work = asyncio.create_task(store.wait_for_work(math.inf))
        change = asyncio.create_task(store.wait_for_change(math.inf))
        await asyncio.sleep(0)
        await store.complete("e", [Completion(end.id, claimed[end.id].fence, "null")])
        for _ in range(5):
            await asyncio.sleep(0)
        got = (work.done(), change.done())
        work.cancel()
        change.cancel()
        return got

    assert await woken(plain) == (False, True)
    assert await woken(limited) == (True, True)  # its slot, and its dependant, freed


def test_a_free_slow_expert_leaves_the_work_to_a_busy_fast_one() -> None:
    # One kind; `fast` runs it in 0.25 s, `slow` in 1 s, one slot each; a task every 0.4 s.
    # Claiming at once, `slow` took each task that came while `fast` was busy and ran it
    # four times as long; leaving those to `fast` for up to 0.75 s, it takes almost none.
    sc = Scenario(
        "fast and slow",
        {"k": Kind("k", base=1.0)},
        (SimExpert("fast", 1, speed={"k": 4.0}), SimExpert("slow", 1)),
        tuple(Job(f"t{n:03d}", "k", 0.4 * n + (0.2 if n % 3 == 0 else 0.0)) for n in range(150)),
    )
    runs: dict[str, int] = {}
    duration = Scenario.duration

    def counted(self: Scenario, expert: SimExpert, job: Job) -> float:
        runs[expert.name] = runs.get(expert.name, 0) + 1
        return duration(self, expert, job)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scenario, "duration", counted)
        r = simulate(sc, "race", SimConfig(seed=1))
    # claiming at once: 17 on `slow`, mean completion 1.32 x the planner's; now 4 (before the
    # heartbeats told `slow` how fast `fast` is) and 1.07 x
    assert runs.get("slow", 0) <= 6, runs
    greedy = simulate(sc, "greedy")
    assert r.mean_completion <= greedy.mean_completion * 1.15, (r, greedy)
