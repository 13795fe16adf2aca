"""The expert's competition policies, without I/O."""

from __future__ import annotations

import pytest

from contend import App
from contend.domain.scoring import (
    ExpertView,
    Fitness,
    TaskView,
    by_shape,
    default_fitness,
    scores_by_shape,
    speed_fitness,
)
from contend.domain.task import Capabilities, Requirements
from contend.errors import ConfigError
from contend.runtime.competition import (
    MAX_BEST,
    PEEK_MAX,
    PEEK_MIN,
    Competition,
    LeftToRivals,
    PressurePolicy,
    TypeTracker,
)
from contend.store.port import Backlog, ExpertInfo, ExpertRecord


def comp(name: str = "me", tags: tuple[str, ...] = (), **kw: object) -> Competition:
    kw.setdefault("fitness", default_fitness)
    return Competition(
        name,
        Capabilities(frozenset(tags)),
        4,
        ["default"],
        window=0.1,
        **kw,
    )  # type: ignore[arg-type]


def peer(
    name: str,
    tags: tuple[str, ...] = (),
    *,
    load: int = 0,
    tier: str = "general",
    metrics: dict[str, object] | None = None,
    alive: bool = True,
) -> ExpertRecord:
    info = ExpertInfo(name, Capabilities(frozenset(tags)), ("default",), 4, tier)
    return ExpertRecord(info, "s", alive, load, 0.0, 0.0, 0.0, metrics=metrics or {})


def view(task_type: str = "t", req: Requirements | None = None) -> TaskView:
    return TaskView("id1", task_type, "default", 0, req or Requirements(), 0.0)


def test_tracker_counts_and_smooths_run_time() -> None:
    tr = TypeTracker(alpha=0.5)
    tr.record("a", True, 1.0)
    tr.record("a", True, 3.0)
    tr.record("a", False, 100.0)
    rec = tr.snapshot()["a"]
    assert (rec.done, rec.failed, rec.mean_seconds) == (2, 1, 2.0)
    assert abs(rec.success_rate - 2 / 3) < 1e-9


def test_tracker_is_bounded() -> None:
    tr = TypeTracker(limit=3)
    for i in range(10):
        tr.record(f"type{i}", True, 1.0)
    assert len(tr.snapshot()) == 3


def test_no_race_when_alone_or_among_equals() -> None:
    c = comp()
    c.update_peers([peer("me")], 0)
    assert not c.race_matters(0)
    c.update_peers([peer("me"), peer("twin")], 0)
    assert not c.race_matters(0)
    c.update_peers([peer("me"), peer("gpu-box", ("gpu",))], 0)
    assert c.race_matters(0)
    c.update_peers([peer("me"), peer("gone", ("gpu",), alive=False)], 0)
    assert not c.race_matters(0)


def test_a_much_faster_rival_makes_the_race_matter_and_wait() -> None:
    c = comp()
    for _ in range(5):
        c.tracker.record("t", True, 4.0)
    fast = peer("fast", metrics={"types": {"t": [5, 0, 1.0]}})
    c.update_peers([fast], 0)
    assert c.race_matters(0)
    assert c.typical["t"] == 1.0
    ((delay, _, _),) = c.plan([view("t")], 0)
    assert 0.1 * 0.75 * 0.9 * 0.99 <= delay <= 0.1 * (1 + c.cluster_load / 0.8) * 0.76 * 1.1


def test_speed_noise_smaller_than_the_window_runs_no_race() -> None:
    # 1 ms tasks timed at 1.0 and 1.5 ms: 50 % apart, but a race would hold each task back
    # for up to a window (0.1 s here) to save half a millisecond, so equals claim at once
    c = comp()
    for _ in range(5):
        c.tracker.record("t", True, 0.0015)
    c.update_peers([peer("twin", metrics={"types": {"t": [5, 0, 0.001]}})], 0)
    assert not c.race_matters(0)
    # the same ratio on tasks long enough to repay the wait does run the race
    for _ in range(20):
        c.tracker.record("t", True, 1.5)
    c.update_peers([peer("twin", metrics={"types": {"t": [5, 0, 1.0]}})], 0)
    assert c.race_matters(0)


def test_equally_fit_rivals_break_the_tie_by_jitter() -> None:
    # docs/competition.md says jitter breaks ties; equals used to wait exactly 0, all alike
    draws = iter([0.25, 0.75])
    c = comp(rand=lambda: next(draws))
    c.update_peers([peer("me"), peer("twin"), peer("gpu-box", ("gpu",))], 0)
    assert c.race_matters(0)  # rivals differ, so a race is run
    first = c.plan([view("t")], 0)[0][0]
    second = c.plan([view("t")], 0)[0][0]
    jitter_span = c.window * c.jitter
    assert (first, second) == (jitter_span * 0.25, jitter_span * 0.75)


def test_the_fittest_without_a_tie_does_not_wait() -> None:
    c = comp()
    c.update_peers([peer("slow", metrics={"types": {"t": [5, 0, 9.0]}})], 0)
    for _ in range(5):
        c.tracker.record("t", True, 1.0)
    c.update_peers(c.peers, 0)
    assert c.plan([view("t")], 0)[0][0] == 0.0


def test_preferred_zone_adds_the_margin() -> None:
    c = comp(tags=("zone:us",), zone_margin=0.5)
    c.update_peers([peer("eu", ("zone:eu",))], 0)
    ((delay, _, _),) = c.plan([view("t", Requirements(prefer=frozenset({"zone:eu"})))], 0)
    assert delay >= 0.5


def test_window_grows_with_cluster_load() -> None:
    c = comp()
    c.update_peers([peer("busy", load=4)], 4)
    assert c.cluster_load == 1.0
    assert abs(c.window - 0.1 * (1 + 1 / 0.8)) < 1e-9


def test_a_race_peeks_as_deep_as_its_rivals_have_free_slots() -> None:
    c = comp()
    assert c.peek_depth(1) == PEEK_MIN  # alone: 3 a slot, at least the minimum
    assert c.peek_depth(8) == 24
    # 30 rivals of 4 slots, 10 of them busy: 80 free slots would chase the same head
    rivals = [peer(f"r{n}", load=4 if n < 10 else 0) for n in range(30)]
    c.update_peers(rivals, 0)
    assert c.peek_depth(1) == 80
    # neither a gone rival nor one on other queues counts, and the depth is bounded
    elsewhere = ExpertRecord(ExpertInfo("x", Capabilities(), ("other",), 4), "s", True, 0, 0, 0, 0)
    c.update_peers([*rivals, peer("gone", alive=False), elsewhere], 0)
    assert c.peek_depth(1) == 80
    c.update_peers([peer(f"r{n}") for n in range(1_000)], 0)
    assert c.peek_depth(1) == PEEK_MAX


def test_an_inactive_emergency_expert_is_no_rival() -> None:
    c = comp()
    c.update_peers([peer("reserve", ("gpu",), tier="emergency", metrics={"active": False})], 0)
    assert c.rivals() == []


def test_emergency_joins_under_pressure_and_stands_down_with_hysteresis() -> None:
    c = comp(tier="emergency", pressure=PressurePolicy(backlog_per_expert=10, max_wait=30))
    c.update_peers([peer("worker", load=1)], 0)
    assert not c.active
    assert not c.update_pressure(Backlog(5, 1.0), 0)
    assert c.update_pressure(Backlog(11, 1.0), 0)  # > 10 per live regular expert
    assert c.update_pressure(Backlog(6, 1.0), 0)  # still above half: stays
    assert not c.update_pressure(Backlog(4, 1.0), 0)  # below half: stands down
    assert c.update_pressure(Backlog(1, 31.0), 0)  # the oldest task waited too long


def test_metrics_are_json_and_carry_lost_races() -> None:
    c = comp()
    c.tracker.record("t", True, 0.5)
    m = c.metrics(claim_attempts=10, claims_won=8)
    assert m["lost_races"] == 2
    assert m["types"] == {"t": [1, 0, 0.5]}


def test_a_fifo_queue_has_no_race() -> None:
    c = comp()
    for _ in range(5):
        c.tracker.record("t", True, 4.0)
    fast = peer("fast", metrics={"types": {"t": [5, 0, 1.0]}})
    c.update_peers([fast], 0)
    assert c.race_matters(0) and c.plan([view("t")], 0)[0][0] > 0  # it waits for 'fast'
    fifo = comp(fifo=frozenset({"default"}))
    for _ in range(5):
        fifo.tracker.record("t", True, 4.0)
    fifo.update_peers([fast], 0)
    assert not fifo.race_matters(0)  # every queue of its is fifo: claim at once
    assert fifo.plan([view("t")], 0) == [(0.0, 0, "id1")]


def test_queue_modes_are_checked() -> None:
    app = App("memory://")
    app.queue("bulk", mode="fifo")
    assert app.queue_modes == {"bulk": "fifo"}
    app.queue("bulk", mode="compete")
    assert app.queue_modes == {}
    app.queue("bulk", mode="central")
    assert app.queue_modes == {"bulk": "central"}
    app.queue("bulk", mode="compete")
    with pytest.raises(ConfigError, match="mode of queue 'bulk' must be one of"):
        app.queue("bulk", mode="leader")
    with pytest.raises(Exception, match="queue"):
        app.queue("", mode="fifo")
    assert app.queue_modes == {}


def test_an_off_zone_expert_waits_for_a_far_in_zone_rivals_round_trips() -> None:
    # the far zone's rival needs its wake-up, peek and claim, 2 round trips of 80 ms, to land
    # its claim, and half a round trip of slack for its own processing; the zone margin and
    # the race's delay (90 ms here) made the near expert take the task first
    prefer_eu = Requirements(prefer=frozenset({"zone:eu"}))
    c = comp(tags=("zone:us",), zone_margin=0.05, rand=lambda: 0.5)  # jitter's middle: none
    c.update_peers([peer("eu", ("zone:eu",))], 0)
    ((plain, _, _),) = c.plan([view("t", prefer_eu)], 0, rtt=0.002)
    assert plain == pytest.approx(0.05 + 0.1 * (1 - 0.6))  # round trips not known
    c.update_peers([peer("eu", ("zone:eu",), metrics={"claim_ms": 80.0})], 0)
    ((delay, _, _),) = c.plan([view("t", prefer_eu)], 0, rtt=0.002)
    assert delay == pytest.approx(2.5 * 0.080 - 2 * 0.002)
    # a rival with no free slot claims nothing (and scores below this idle expert): only the
    # zone margin is waited
    c.update_peers([peer("eu", ("zone:eu",), load=4, metrics={"claim_ms": 80.0})], 0)
    ((delay, _, _),) = c.plan([view("t", prefer_eu)], 0, rtt=0.002)
    assert delay == pytest.approx(0.05)


def test_equals_with_known_round_trips_take_turns_by_task() -> None:
    # two equally fit experts (a third, different one makes the race matter): each is first
    # for some tasks and, on the rest, waits out the other's jitter (up to window × jitter,
    # 10 ms), then its round trip and slack (3 + 1.5 ms); the same order in both
    views = [TaskView(f"task-{i}", "t", "default", 0, Requirements(), 0.0) for i in range(40)]
    delays: dict[str, dict[str, float]] = {}
    for name, twin in (("a", "b"), ("b", "a")):
        c = comp(name, rand=lambda: 0.0)
        c.update_peers([peer(twin, metrics={"claim_ms": 3.0}), peer("gpu", ("gpu",))], 0)
        delays[name] = {tid: d for d, _, tid in c.plan(views, 0, rtt=0.003)}
    for v in views:
        pair = sorted((delays["a"][v.id], delays["b"][v.id]))
        assert pair == [0.0, pytest.approx(0.01 + 0.003 + 0.0015)], v.id
    firsts = sum(1 for v in views if delays["a"][v.id] == 0.0)
    assert 10 <= firsts <= 30  # split between them, not all to one


def test_a_rival_tied_at_the_top_is_waited_for_through_its_jitter_and_late_check() -> None:
    # two idle GPU experts tie for a GPU task; each waits its jitter and reads again before it
    # claims, so a third, slower expert must leave them a round trip more than for a lone
    # fittest one (it read too early and lost the task half the time)
    gpu = Requirements(tags=frozenset({"gpu"}))
    slow = comp(
        tags=("gpu",), fitness=lambda e, t: 0.5 if e.name == "me" else 1.0, rand=lambda: 0.5
    )
    slow.update_peers([peer("g1", ("gpu",), metrics={"claim_ms": 40.0})], 0)
    ((alone, _, _),) = slow.plan([view("t", gpu)], 0, rtt=0.002)
    # wake-up, peek and claim: 2 of its round trips, half one of slack, less this one's read
    assert alone == pytest.approx(2 * 0.040 + 0.020 - 2 * 0.002)
    slow.update_peers([peer(n, ("gpu",), metrics={"claim_ms": 40.0}) for n in ("g1", "g2")], 0)
    ((tied, _, _),) = slow.plan([view("t", gpu)], 0, rtt=0.002)
    # and its late check's round trip, after the most its jitter can be (window × jitter)
    assert tied == pytest.approx(3 * 0.040 + 0.1 * 0.1 + 0.020 - 2 * 0.002)


def test_an_expert_scores_itself_as_its_rivals_see_it() -> None:
    # Two equal experts, each idle now but published (seconds ago) with a busy slot, each
    # scoring the other by its published load: on their live loads each saw itself fitter
    # and both went at once. On what both published they agree: the one that published
    # less load goes first, the other waits.
    c_a = comp("a", rand=lambda: 0.5)
    c_b = comp("b", rand=lambda: 0.5)
    records = [peer("a", load=0), peer("b", load=2), peer("gpu", ("gpu",))]
    c_a.update_peers(records, 0)
    c_b.update_peers(records, 0)
    ((first, _, _),) = c_a.plan([view()], load=3)  # live load higher than it published
    ((second, _, _),) = c_b.plan([view()], load=0)  # live load lower than it published
    assert first == 0.0 and second > 0.0


# -- scoring rivals once per task, or per shape, between heartbeats -------------------------
def _counting(fitness: Fitness, calls: list[str]) -> Fitness:
    def counted(expert: ExpertView, task: TaskView) -> float:
        calls.append(expert.name)
        return fitness(expert, task)

    return counted


def _batch(n: int) -> list[TaskView]:
    """*n* tasks of two shapes, all created at once."""
    return [TaskView(f"id{i}", "ab"[i % 2], "default", 0, Requirements(), 0.0) for i in range(n)]


def _rivals() -> list[ExpertRecord]:
    return [
        peer(f"r{i}", load=i % 4, metrics={"specialties": ["a"] if i % 3 else []})
        for i in range(20)
    ]


def test_rivals_are_scored_once_per_shape_between_heartbeats() -> None:
    calls: list[str] = []
    c = comp(fitness=by_shape(_counting(default_fitness, calls)))
    c.update_peers(_rivals(), 0)
    reference = comp(rand=lambda: 0.5)
    reference.update_peers(_rivals(), 0)
    c.rand = lambda: 0.5
    first = c.plan(_batch(16), 1)
    assert len(calls) == 16 + 2 * 20  # mine for each task, the rivals' once per shape
    assert c.plan(_batch(16), 1) == first
    assert len(calls) == 2 * 16 + 2 * 20  # nothing new until the rivals change
    assert first == reference.plan(_batch(16), 1)  # what scoring every task gives
    c.update_peers(_rivals()[:5], 0)
    c.plan(_batch(16), 1)
    assert len(calls) == 3 * 16 + 2 * 20 + 2 * 5


def test_an_unmarked_fitness_is_scored_per_task() -> None:
    # a fitness may read the id (consistent hashing): one score per task, not per shape
    def by_id(expert: ExpertView, task: TaskView) -> float:
        return 0.9 if (int(task.id[2:]) % 2 == 0) == (expert.name == "me") else 0.3

    c = comp(fitness=by_id, rand=lambda: 0.5)
    c.update_peers([peer("me"), peer("rival")], 0)
    plan = c.plan(_batch(4), 0)
    waits = {tid: delay for delay, _, tid in plan}
    assert waits["id0"] == waits["id2"] == 0.0
    assert waits["id1"] > 0 and waits["id3"] > 0


def test_the_memo_of_rival_scores_is_bounded() -> None:
    c = comp()
    c.update_peers(_rivals(), 0)
    for i in range(MAX_BEST + 10):
        c.rival_scores(TaskView(f"id{i}", "t", "default", i, Requirements(), 0.0))
    assert 0 < len(c._scores) <= MAX_BEST


def test_speed_fitness_scores_by_shape_when_its_parts_do() -> None:
    def speed(expert: ExpertView, task: TaskView) -> float:
        return 2.0

    assert scores_by_shape(default_fitness)
    assert not scores_by_shape(speed_fitness(speed, 2.0))
    assert scores_by_shape(speed_fitness(by_shape(speed), 2.0))
    assert not scores_by_shape(speed_fitness(by_shape(speed), 2.0, base=lambda e, t: 1.0))


def test_with_round_trips_known_each_rivals_score_is_kept_too() -> None:
    calls: list[str] = []
    c = comp(fitness=by_shape(_counting(default_fitness, calls)), rand=lambda: 0.5)
    c.update_peers([peer(f"r{i}", metrics={"claim_ms": 2.0}) for i in range(5)], 0)
    best, theirs = c.rival_scores(_batch(1)[0])
    assert len(theirs) == 5 and best == max(theirs)
    first = c.plan(_batch(6), 0, rtt=0.002)
    assert c.plan(_batch(6), 0, rtt=0.002) == first
    assert len(calls) == 5 + 5 + 2 * 6  # the rivals once per shape, this expert per task


def test_the_rivals_to_steal_from_are_those_holding_prefetched_tasks() -> None:
    c = comp()
    c.update_peers(
        [
            peer("me", metrics={"prefetched": 9}),
            peer("some", load=4, metrics={"prefetched": 2}),
            peer("none", load=4, metrics={"prefetched": 0}),
            peer("most", load=4, metrics={"prefetched": 5}),
            peer("gone", load=4, metrics={"prefetched": 7}, alive=False),
        ],
        0,
    )
    assert [p.info.id for p in c.loaded] == ["most", "some"]


def test_one_unlike_rival_among_many_alike_makes_the_race_matter() -> None:
    c = comp()
    twins = [peer(f"twin{i:03d}") for i in range(200)]
    c.update_peers([*twins], 0)
    assert not c.race_matters(0)
    c.update_peers([*twins, peer("zz-gpu", ("gpu",))], 0)
    assert c.race_matters(0)
    c.update_peers([*twins, peer("zz-gpu", ("gpu",), alive=False)], 0)
    assert not c.race_matters(0)


def _queue(task_type: str, n: int) -> list[TaskView]:
    return [TaskView(f"q{i}", task_type, "default", 0, Requirements(), 0.0) for i in range(n)]


def test_a_slow_expert_leaves_a_short_queue_to_a_faster_busy_rival() -> None:
    # mine 4 s, the rival's 1 s on 4 slots: the first tasks would end sooner there, even
    # after a wait for a slot; the rest would not, and are this expert's at once
    c = comp()
    for _ in range(5):
        c.tracker.record("t", True, 4.0)
    c.update_peers([peer("fast", load=4, metrics={"types": {"t": [5, 0, 1.0]}})], 0)
    left = c.deferrals(_queue("t", 14), 0)
    # (n / 4 + 1) x 1 s < 4 s for n up to 11: each waits at most 4 - 1 = 3 s
    assert left == {f"q{i}": 3.0 for i in range(11)}


def test_nothing_is_left_to_rivals_that_are_not_faster_or_cannot_run_it() -> None:
    c = comp()
    for _ in range(5):
        c.tracker.record("t", True, 4.0)
    c.update_peers(
        [
            peer("alike", metrics={"types": {"t": [5, 0, 3.6]}}),  # not a fifth faster
            peer("new", metrics={"types": {"t": [2, 0, 0.5]}}),  # too few runs to say
            peer("nogpu", metrics={"types": {"g": [5, 0, 0.5]}}),
        ],
        0,
    )
    gpu = Requirements(frozenset({"gpu"}))
    assert c.deferrals([*_queue("t", 3), TaskView("g1", "g", "default", 0, gpu, 0.0)], 0) == {}
    assert comp().deferrals(_queue("t", 3), 0) == {}  # no rivals at all


def test_without_its_own_runs_an_expert_reckons_its_time_from_fitness() -> None:
    # a rival 4x as fit that runs the type in 1 s: this expert would take about 4 s
    @by_shape
    def speed(expert: ExpertView, task: TaskView) -> float:
        return 4.0 if expert.name == "fast" else 1.0

    c = comp(fitness=speed_fitness(speed, 4.0))
    c.update_peers([peer("fast", metrics={"types": {"t": [5, 0, 1.0]}})], 0)
    left = c.deferrals(_queue("t", 2), 0)
    assert set(left) == {"q0", "q1"}
    assert left["q0"] == pytest.approx(3.0)


def test_tasks_left_to_rivals_come_back_when_their_time_is_up() -> None:
    c = comp()
    for _ in range(5):
        c.tracker.record("t", True, 4.0)
    c.update_peers([peer("fast", load=4, metrics={"types": {"t": [5, 0, 1.0]}})], 0)
    now = [100.0]
    left = LeftToRivals(c, lambda: now[0])
    queue = _queue("t", 14)
    # the first 11 are left for 3 s from when they were first seen; the last 3 are taken
    assert [v.id for v in left.keep(queue, 0, shallow=True)] == ["q11", "q12", "q13"]
    assert left.take_wake() == 103.0
    assert left.take_wake() is None  # once
    now[0] = 102.0  # seen 2 s ago: their wait is reckoned from then, not from now
    assert [v.id for v in left.keep(queue[:11], 0, shallow=True)] == []
    assert left.wake == 103.0
    now[0] = 103.0
    assert len(left.keep(queue[:11], 0, shallow=True)) == 11
    # a deep peek does not show the whole queue: nothing is left, and what was seen is forgotten
    assert left.keep(queue, 0, shallow=False) == queue
    now[0] = 104.0
    assert [v.id for v in left.keep(queue, 0, shallow=True)] == ["q11", "q12", "q13"]
