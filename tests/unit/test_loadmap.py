"""The load map is a CRDT: replicas that saw the same writes, in any order and any number of
times, hold the same map; a tombstone buries a dead run and only a newer write lifts it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from contend.domain.loadmap import Entry, LoadMap, canonical, entry, join, merge

MEMBERS = ["a", "b", "c"]
TEXTS = [None, canonical({"l": 0}), canonical({"l": 1}), canonical({"l": 2, "q": ["x"]})]

entries = st.builds(
    Entry,
    incarnation=st.integers(0, 2),
    version=st.integers(0, 3),
    text=st.sampled_from(TEXTS),
)
maps = st.dictionaries(st.sampled_from(MEMBERS), entries, max_size=3)


@given(maps, maps)
def test_merge_is_commutative(a: dict[str, Entry], b: dict[str, Entry]) -> None:
    assert merge(a, b) == merge(b, a)


@given(maps, maps, maps)
def test_merge_is_associative(
    a: dict[str, Entry], b: dict[str, Entry], c: dict[str, Entry]
) -> None:
    assert merge(merge(a, b), c) == merge(a, merge(b, c))


@given(maps)
def test_merge_is_idempotent(a: dict[str, Entry]) -> None:
    assert merge(a, a) == a
    assert merge(merge(a, a), a) == a


@given(entries, entries)
def test_join_picks_one_of_the_two_and_never_goes_back(x: Entry, y: Entry) -> None:
    won = join(x, y)
    assert won in (x, y)
    assert won.rank() >= x.rank() and won.rank() >= y.rank()


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.sampled_from(MEMBERS), entries), max_size=12),
    st.randoms(use_true_random=False),
)
def test_replicas_converge_whatever_the_order_and_the_repeats(
    writes: list[tuple[str, Entry]], rnd: random.Random
) -> None:
    """Two replicas take the same writes, one in order, the other shuffled and with
    repeats: both hold the merge of every write."""
    first, second = LoadMap(), LoadMap()
    for member, e in writes:
        first.put(member, e, 0.0)
    again = writes + writes[: len(writes) // 2]
    rnd.shuffle(again)
    for member, e in again:
        second.put(member, e, 0.0)
    expected: dict[str, Entry] = {}
    for member, e in writes:
        expected = merge(expected, {member: e})
    assert first.entries() == second.entries() == expected


def test_a_tombstone_wins_the_tie_and_a_later_version_lifts_it() -> None:
    m = LoadMap()
    assert m.put("a", entry(1, 3, {"l": 2}), now=0.0)
    assert m.bury("a", now=1.0)
    assert m.live() == {}
    # a late copy of the buried state, still in gossip, stays buried
    assert not m.put("a", entry(1, 3, {"l": 2}), now=2.0)
    assert not m.put("a", entry(1, 2, {"l": 1}), now=2.0)
    assert m.live() == {}
    # the run was only paused: it refuted and published again
    assert m.put("a", entry(1, 4, {"l": 0}), now=3.0)
    assert m.live()["a"].state == {"l": 0}


def test_a_new_run_beats_the_old_runs_tombstone_at_any_version() -> None:
    m = LoadMap()
    m.put("a", entry(5, 900, {"l": 7}), now=0.0)
    m.bury("a", now=0.0)
    assert m.put("a", entry(6, 1, {"l": 0}), now=0.0)
    assert m.get("a") == entry(6, 1, {"l": 0})


def test_a_death_heard_before_the_member_is_remembered() -> None:
    m = LoadMap()
    assert m.bury("a", now=0.0, upto=entry(2, 5, {"l": 1}))
    assert not m.put("a", entry(2, 5, {"l": 1}), now=0.0)
    assert m.live() == {}


def test_tombstones_are_forgotten_after_their_time_on_the_callers_clock() -> None:
    m = LoadMap()
    m.put("a", entry(1, 1, {}), now=0.0)
    m.put("b", entry(1, 1, {}), now=0.0)
    m.bury("a", now=10.0)
    assert m.forget(before=10.0) == []  # laid at 10: not before 10
    assert m.forget(before=10.5) == ["a"]
    assert m.get("a") is None and len(m) == 1
    # forgotten: a copy of the old state could come back, which is why the caller forgets
    # only after failure detection has stopped passing that run's rumours on
    assert m.put("a", entry(1, 1, {}), now=11.0)


def test_the_map_is_bounded() -> None:
    m = LoadMap(limit=2)
    assert m.put("a", entry(1, 1, {}), 0.0)
    assert m.put("b", entry(1, 1, {}), 0.0)
    assert not m.put("c", entry(1, 1, {}), 0.0)
    assert not m.bury("c", 0.0, upto=entry(1, 1, {}))
    assert m.put("a", entry(1, 2, {}), 0.0)  # members already in still update
    assert m.bury("b", 0.0)
    assert len(m) == 2


def test_an_entry_reads_back_its_state() -> None:
    e = entry(1, 1, {"q": ["x"], "l": 3})
    assert e.text == '{"l":3,"q":["x"]}'
    assert e.state == {"l": 3, "q": ["x"]}
    assert e.buried().state == {} and e.buried().dead
