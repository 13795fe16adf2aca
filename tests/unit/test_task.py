"""contend.domain.task: validation of submissions, requirements, ageing, cycles, ids."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contend.domain.task import (
    MAX_PAYLOAD_BYTES,
    TERMINAL_STATES,
    TRANSITIONS,
    Capabilities,
    Requirements,
    TaskSpec,
    TaskState,
    can_move,
    effective_priority,
    encode_json,
    find_cycle,
    new_task_id,
)
from contend.errors import PayloadError, TaskError

# -- TaskSpec.build ------------------------------------------------------------------------------


def test_build_with_defaults() -> None:
    s = TaskSpec.build("mail.send", [1, "x"], {"to": "a@b"})
    assert (s.type, s.args_json, s.kwargs_json) == ("mail.send", '[1,"x"]', '{"to":"a@b"}')
    assert (s.queue, s.priority, s.key, s.delay, s.max_attempts, s.timeout) == (
        "default",
        0,
        None,
        0.0,
        3,
        None,
    )
    assert s.requirements == Requirements() and s.requirements.empty
    assert s.depends_on == ()
    assert len(s.id) == 28


def test_build_keeps_dependencies_in_order_without_duplicates() -> None:
    s = TaskSpec.build("t", depends_on=["b", "a", "b", "c", "a"])
    assert s.depends_on == ("b", "a", "c")


def test_build_accepts_tuples_and_unicode_and_makes_floats() -> None:
    s = TaskSpec.build("t", ("é", None), delay=2, timeout=3)
    assert s.args_json == '["é",null]'
    assert isinstance(s.delay, float) and isinstance(s.timeout, float)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"type": ""}, TaskError, "task type"),
        ({"type": 3}, TaskError, "task type"),
        ({"args": "abc"}, PayloadError, "args must be a JSON array"),
        ({"args": b"abc"}, PayloadError, "args must be a JSON array"),
        ({"args": {"a": 1}}, PayloadError, "args must be a JSON array"),
        ({"args": [object()]}, PayloadError, "args is not JSON"),
        ({"args": [{1, 2}]}, PayloadError, "args is not JSON"),
        ({"args": [math.nan]}, PayloadError, "args is not JSON"),
        ({"args": ["x" * MAX_PAYLOAD_BYTES]}, PayloadError, "limit"),
        ({"kwargs": [1]}, PayloadError, "kwargs must be a JSON object"),
        ({"kwargs": {"f": print}}, PayloadError, "kwargs is not JSON"),
        ({"queue": ""}, TaskError, "queue"),
        ({"queue": "q" * 201}, TaskError, "queue"),
        ({"queue": None}, TaskError, "queue"),
        ({"priority": 1.5}, TaskError, "priority must be an integer"),
        ({"priority": True}, TaskError, "priority must be an integer"),
        ({"priority": 10**7}, TaskError, "priority 10000000 is outside"),
        ({"priority": -(10**7)}, TaskError, "outside"),
        ({"key": ""}, TaskError, "idempotency key"),
        ({"key": "k" * 501}, TaskError, "idempotency key"),
        ({"key": 5}, TaskError, "idempotency key"),
        ({"delay": -1}, TaskError, "delay"),
        ({"delay": math.inf}, TaskError, "delay"),
        ({"delay": math.nan}, TaskError, "delay"),
        ({"delay": True}, TaskError, "delay"),
        ({"delay": 400 * 86400}, TaskError, "delay"),
        ({"max_attempts": 0}, TaskError, "max_attempts must be between 1 and 1000"),
        ({"max_attempts": 1001}, TaskError, "max_attempts"),
        ({"max_attempts": 2.0}, TaskError, "max_attempts must be an integer"),
        ({"max_attempts": False}, TaskError, "max_attempts must be an integer"),
        ({"timeout": 0}, TaskError, "timeout"),
        ({"timeout": -5}, TaskError, "timeout"),
        ({"timeout": math.inf}, TaskError, "timeout"),
        ({"depends_on": [""]}, TaskError, "dependency"),
        ({"depends_on": [7]}, TaskError, "dependency"),
        ({"depends_on": ["a"], "if_failed": ["ignore"]}, TaskError, "one of fail, cancel, run"),
        ({"depends_on": ["a"], "if_failed": [None]}, TaskError, "one of fail, cancel, run"),
        ({"depends_on": ["a"], "if_failed": ["run", "run"]}, TaskError, "one per dependency"),
        ({"if_failed": ["run"]}, TaskError, "one per dependency"),
        ({"depends_on": ["a", "a"], "if_failed": ["run", "fail"]}, TaskError, "given twice"),
        ({"requirements": {"tagz": ["gpu"]}}, TaskError, "unknown keys"),
        ({"requirements": {"resources": {"mem": -1}}}, TaskError, "must not be negative"),
        ({"requirements": {"resources": {"mem": "lots"}}}, TaskError, "finite number"),
        ({"requirements": {"resources": {"mem": math.inf}}}, TaskError, "finite number"),
        ({"requirements": {"resources": ["mem"]}}, TaskError, "mapping"),
        ({"requirements": [""]}, TaskError, "non-empty string"),
        ({"requirements": {"tags": 5}}, TaskError, "list of strings"),
    ],
)
def test_build_refuses_a_bad_submission_naming_the_problem(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    call = {"type": "t", **kwargs}
    with pytest.raises(error, match=words):
        TaskSpec.build(**call)  # type: ignore[arg-type]


def test_payload_limit_counts_args_and_kwargs_together() -> None:
    half = "x" * (MAX_PAYLOAD_BYTES // 2)
    with pytest.raises(PayloadError, match="together"):
        TaskSpec.build("t", [half], {"k": half})
    TaskSpec.build("t", ["x" * 100], limit=200)
    with pytest.raises(PayloadError, match="limit is 50 bytes"):
        TaskSpec.build("t", ["x" * 100], limit=50)


def test_encode_json_names_what_is_wrong() -> None:
    assert encode_json({"a": [1, None]}, "result") == '{"a":[1,null]}'
    with pytest.raises(PayloadError, match="checkpoint is not JSON"):
        encode_json({"a": object()}, "checkpoint")
    with pytest.raises(PayloadError, match="result is 10 bytes"):
        encode_json("éééé", "result", limit=5)  # size is counted in bytes, not chars


# -- requirements and capabilities --------------------------------------------------------------


def test_requirements_of_accepts_its_forms() -> None:
    assert Requirements.of(None).empty
    assert Requirements.of("gpu") == Requirements(frozenset({"gpu"}), {})
    assert Requirements.of(["gpu", " ssd "]).tags == frozenset({"gpu", "ssd"})
    r = Requirements.of({"tags": ["gpu"], "resources": {"mem_gb": 8}})
    assert r.tags == frozenset({"gpu"}) and r.resources == {"mem_gb": 8.0}
    assert Requirements.of(r) is r


def test_requirements_json_round_trip() -> None:
    r = Requirements.of({"tags": ["b", "a"], "resources": {"z": 1, "y": 2.5}})
    assert r.to_json() == {"tags": ["a", "b"], "resources": {"y": 2.5, "z": 1.0}}
    assert Requirements.from_json(r.to_json()) == r
    assert Requirements().to_json() is None
    assert Requirements.from_json(None).empty


@pytest.mark.parametrize(
    ("offer", "need", "fits"),
    [
        (Capabilities(), Requirements(), True),
        (Capabilities(frozenset({"gpu"})), Requirements.of("gpu"), True),
        (Capabilities(frozenset({"gpu", "ssd"})), Requirements.of("gpu"), True),
        (Capabilities(frozenset({"ssd"})), Requirements.of("gpu"), False),
        (Capabilities(frozenset({"gpu"})), Requirements.of(["gpu", "ssd"]), False),
        (Capabilities(resources={"mem": 16}), Requirements.of({"resources": {"mem": 16}}), True),
        (Capabilities(resources={"mem": 15.9}), Requirements.of({"resources": {"mem": 16}}), False),
        (Capabilities(), Requirements.of({"resources": {"mem": 1}}), False),
        (Capabilities(), Requirements.of({"resources": {"mem": 0}}), True),
        (
            Capabilities(frozenset({"gpu"}), {"mem": 32}),
            Requirements.of({"tags": ["gpu"], "resources": {"mem": 16}}),
            True,
        ),
        (
            Capabilities(frozenset(), {"mem": 32}),
            Requirements.of({"tags": ["gpu"], "resources": {"mem": 16}}),
            False,
        ),
    ],
)
def test_capabilities_satisfy_requirements(
    offer: Capabilities, need: Requirements, fits: bool
) -> None:
    assert offer.satisfies(need) is fits
    assert (offer.match_score(need) > 0) is fits


def test_match_score_prefers_the_bare_fit() -> None:
    need = Requirements.of("gpu")
    bare = Capabilities(frozenset({"gpu"}))
    roomy = Capabilities(frozenset({"gpu", "ssd", "fast", "big"}))
    assert bare.match_score(need) == 1.0
    assert 0 < roomy.match_score(need) < bare.match_score(need)
    assert Capabilities().match_score(Requirements()) == 1.0


def test_capabilities_parse_cli_items() -> None:
    c = Capabilities.parse(["gpu", "mem_gb=16", " zone:eu ", "cores=2.5"])
    assert c.tags == frozenset({"gpu", "zone:eu"})
    assert c.resources == {"mem_gb": 16.0, "cores": 2.5}
    with pytest.raises(TaskError, match=r"mem_gb=lots.*must be a number"):
        Capabilities.parse(["mem_gb=lots"])
    with pytest.raises(TaskError, match="'mem_gb' must not be negative"):
        Capabilities.parse(["mem_gb=-1"])
    with pytest.raises(TaskError, match="'mem_gb' must be a finite number"):
        Capabilities.parse(["mem_gb=inf"])
    with pytest.raises(TaskError, match="non-empty"):
        Capabilities.parse([" "])
    assert Capabilities.parse([]).to_json() == {"tags": [], "resources": {}}


# -- ageing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [0, 5, -5, 1_000_000, -1_000_000])
def test_effective_priority_starts_at_the_base_and_grows_with_age(base: int) -> None:
    assert effective_priority(base, 0) == base
    ages = [0, 1, 10, 100, 10_000, 10**7]
    values = [effective_priority(base, a) for a in ages]
    assert values == sorted(values) and len(set(values)) == len(values)


def test_priority_zero_and_negatives_age_too() -> None:
    """Seed 002's base × log(age+1) leaves 0 at 0 for ever and pushes negatives further down."""
    assert effective_priority(0, 100) > 0
    assert effective_priority(-3, 100) > -3


def test_an_old_low_priority_task_overtakes_fresh_high_priority_ones() -> None:
    old_low = effective_priority(0, age_seconds=3 * 86400)
    fresh_high = effective_priority(10, age_seconds=0)
    assert old_low > fresh_high
    assert effective_priority(0, 1) < effective_priority(10, 0)


def test_effective_priority_edges() -> None:
    assert effective_priority(4, -50) == 4  # a clock skew does not make a task younger
    assert effective_priority(4, 1000, ageing=0) == 4
    assert effective_priority(0, math.e - 1, ageing=2) == pytest.approx(2.0)


@given(
    st.integers(-1_000_000, 1_000_000),
    st.floats(0, 1e9),
    st.floats(0, 1e9),
)
def test_effective_priority_is_monotonic_in_age(base: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert effective_priority(base, lo) <= effective_priority(base, hi)


# -- transitions -------------------------------------------------------------------------------


def test_transitions_table() -> None:
    assert set(TRANSITIONS) == set(TaskState)
    assert not TRANSITIONS[TaskState.SUCCEEDED]
    for s in TERMINAL_STATES - {TaskState.SUCCEEDED}:
        assert TRANSITIONS[s] == {TaskState.PENDING}  # retry is the only way back
    for s in (TaskState.WAITING, TaskState.PENDING, TaskState.CLAIMED, TaskState.RUNNING):
        assert can_move(s, TaskState.CANCELLED)
    assert not can_move(TaskState.PENDING, TaskState.SUCCEEDED)
    assert not can_move(TaskState.WAITING, TaskState.RUNNING)
    assert TaskState.RUNNING.owned and not TaskState.PENDING.owned
    assert TaskState.DEAD.terminal and not TaskState.WAITING.terminal


# -- dependency cycles -------------------------------------------------------------------------


def _is_cycle(edges: dict[str, list[str]], cycle: list[str]) -> bool:
    return (
        len(cycle) >= 2
        and cycle[0] == cycle[-1]
        and all(b in edges.get(a, ()) for a, b in itertools.pairwise(cycle))
    )


@pytest.mark.parametrize(
    "edges",
    [
        {"a": ["a"]},
        {"a": ["b"], "b": ["a"]},
        {"a": ["b"], "b": ["c"], "c": ["a"]},
        {"x": ["y"], "y": [], "a": ["b"], "b": ["c"], "c": ["b"]},
        {"a": ["zz"], "b": ["a", "c"], "c": ["b"]},
    ],
)
def test_find_cycle_returns_a_real_cycle(edges: dict[str, list[str]]) -> None:
    cycle = find_cycle(edges)
    assert cycle is not None and _is_cycle(edges, cycle), cycle


@pytest.mark.parametrize(
    "edges",
    [
        {},
        {"a": []},
        {"a": ["b"], "b": ["c"]},
        {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []},  # a diamond is not a cycle
        {"a": ["unknown"]},
    ],
)
def test_find_cycle_finds_none_in_a_dag(edges: dict[str, list[str]]) -> None:
    assert find_cycle(edges) is None


@given(st.dictionaries(st.sampled_from("abcdef"), st.lists(st.sampled_from("abcdefg"), max_size=3)))
def test_find_cycle_agrees_with_a_topological_sort(edges: dict[str, list[str]]) -> None:
    nodes = set(edges) | {d for ds in edges.values() for d in ds}
    indegree = dict.fromkeys(nodes, 0)
    for deps in edges.values():
        for d in set(deps):
            indegree[d] += 1
    ready = [n for n, k in indegree.items() if k == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for d in set(edges.get(n, ())):
            indegree[d] -= 1
            if indegree[d] == 0:
                ready.append(d)
    acyclic = seen == len(nodes)
    cycle = find_cycle(edges)
    assert (cycle is None) is acyclic
    if cycle is not None:
        assert _is_cycle(edges, cycle)


def test_find_cycle_copes_with_a_long_chain() -> None:
    n = 50_000
    edges = {str(i): [str(i + 1)] for i in range(n)}
    assert find_cycle(edges) is None
    edges[str(n)] = ["0"]
    cycle = find_cycle(edges)
    assert cycle is not None and len(cycle) == n + 2


# -- ids -----------------------------------------------------------------------------------------


def test_task_ids_are_28_chars_and_strictly_increasing() -> None:
    ids = [new_task_id() for _ in range(5000)]
    assert all(len(i) == 28 for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_task_ids_sort_by_their_time() -> None:
    early = new_task_id(now=2_000_000_000.0)
    later = new_task_id(now=2_000_000_001.0)
    assert early < later
    assert set(early) <= set("0123456789abcdefghjkmnpqrstvwxyz")


def test_a_trace_context_must_be_a_small_map_of_strings() -> None:
    from contend.domain.task import MAX_TRACE_CHARS, TaskSpec, load_trace

    spec = TaskSpec.build("t", trace={"traceparent": "00-ab-cd-01"})
    assert load_trace(spec.trace) == {"traceparent": "00-ab-cd-01"}
    assert TaskSpec.build("t", trace={}).trace is None
    for bad in ({"a": 1}, {1: "a"}, {"a": "x" * MAX_TRACE_CHARS}):
        with pytest.raises(TaskError, match="trace context"):
            TaskSpec.build("t", trace=bad)  # type: ignore[arg-type]


def test_if_failed_is_kept_aligned_and_empty_when_every_edge_fails() -> None:
    s = TaskSpec.build("t", depends_on=["a", "b", "a"], if_failed=["run", "fail", "run"])
    assert (s.depends_on, s.if_failed) == (("a", "b"), ("run", "fail"))
    assert (s.if_failed_of("a"), s.if_failed_of("b"), s.if_failed_of("zz")) == (
        "run",
        "fail",
        "fail",
    )
    assert TaskSpec.build("t", depends_on=["a"], if_failed=["fail"]).if_failed == ()
    assert TaskSpec.build("t", depends_on=["a"]).if_failed == ()
