"""The gossip node's bookkeeping, on a fake cluster and a fake clock: what it hears goes
into the load map, deaths bury, a lost event stream is made good, tombstones are forgotten."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from contend.domain.loadmap import canonical
from contend.errors import ConfigError
from contend.gossip import GossipNode, member_name, summary
from contend.gossip.node import CLUSTER_RATE
from contend.store.port import ExpertInfo


@dataclass
class Member:
    name: str
    epoch: int
    meta: dict[str, str] = field(default_factory=dict)


class FakeCluster:
    def __init__(self, members: list[Member]) -> None:
        self._members = members

    def members(self) -> list[Member]:
        return list(self._members)


def meta(name: str, load: int, version: int) -> dict[str, str]:
    s = summary(ExpertInfo(id=name, queues=("q",), capacity=4), load, {})
    return {"s": canonical(s), "v": str(version)}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def node(clock: Clock, members: list[Member]) -> GossipNode:
    n = GossipNode("me", monotonic=clock, wall=lambda: 1000.0, tombstone_ttl=60.0)
    n._cluster = FakeCluster(members)  # type: ignore[assignment]
    return n


def loads(n: GossipNode) -> dict[str, int]:
    return {r.info.id: r.load for r in n.records() or ()}


def test_what_is_heard_is_in_the_view_and_deaths_bury() -> None:
    clock = Clock()
    n = node(clock, [])
    n._take("a", 5, meta("a", 2, 1))
    n._take("b", 5, meta("b", 1, 1))
    assert loads(n) == {"a": 2, "b": 1}
    n._take("a", 5, meta("a", 7, 0))  # an older version, arriving late: not news
    n._take("b", 5, meta("b", 3, 2))
    assert loads(n) == {"a": 2, "b": 3}
    n._bury("a", 5, meta("a", 2, 1))
    assert loads(n) == {"b": 3}
    n._take("a", 5, meta("a", 2, 1))  # a late copy stays buried
    assert loads(n) == {"b": 3}
    n._take("a", 5, meta("a", 0, 2))  # it refuted and published again
    assert loads(n) == {"a": 0, "b": 3}
    rec = next(r for r in n.records() or () if r.info.id == "a")
    assert (rec.heartbeat_at, rec.started_at, rec.session) == (1000.0, 0.005, "gossip:5")


def test_malformed_metadata_is_ignored() -> None:
    n = node(Clock(), [])
    for bad in (
        {},
        {"s": "{}"},
        {"s": "[]", "v": "1"},
        {"s": "{", "v": "1"},
        {"s": "{}", "v": "x"},
    ):
        n._take("a", 1, bad)
    n._take("b", 1, {"s": canonical({"id": "b"}), "v": "1"})  # a dict, but not a summary
    assert loads(n) == {}


def test_a_resync_takes_the_snapshot_and_buries_who_is_missing() -> None:
    clock = Clock()
    members = [Member("a", 1, meta("a", 1, 1)), Member("b", 1, meta("b", 2, 1))]
    n = node(clock, members)
    n._resync()
    assert loads(n) == {"a": 1, "b": 2}
    members.pop()  # b died while events were lost
    n._resync()
    assert loads(n) == {"a": 1}


def test_tombstones_are_forgotten_on_the_nodes_clock() -> None:
    clock = Clock()
    n = node(clock, [])
    n._take("a", 1, meta("a", 1, 1))
    n._bury("a", 1, meta("a", 1, 1))
    assert n.records() == [] and n.map.get("a") is not None
    clock.now = 59.0
    assert n.records() == [] and n.map.get("a") is not None
    clock.now = 61.0
    assert n.records() == [] and n.map.get("a") is None


def test_records_is_none_when_gossip_is_not_running() -> None:
    n = GossipNode("me")
    assert n.records() is None
    n._cluster = FakeCluster([])  # type: ignore[assignment]
    assert n.records() == []
    n.failed = RuntimeError("gone")
    assert n.records() is None


def test_names_and_settings() -> None:
    assert member_name("e1") == "e1"
    long = "x" * 200
    assert len(member_name(long).encode()) <= 64 and member_name(long) != member_name(long + "y")
    with pytest.raises(ConfigError, match="gossip timing"):
        GossipNode("me", timing="slow")
    with pytest.raises(ConfigError, match="CONTEND_GOSSIP_KEY"):
        GossipNode("me", bind="0.0.0.0:7946")
    GossipNode("me", bind="0.0.0.0:7946", keys=["k"])  # a key: fine anywhere


def test_publish_only_wakes_the_publisher_for_news() -> None:
    n = GossipNode("me")
    state: dict[str, Any] = {"id": "me", "l": 1}
    n.publish(state)
    assert n._changed.is_set()
    n._changed.clear()
    n._sent = canonical(state)
    n.publish(dict(state))
    assert not n._changed.is_set()


def test_a_large_cluster_spaces_its_publishes_to_the_gossip_budget() -> None:
    n = node(Clock(), [])
    assert n.gap() == n.min_gap  # alone
    for i in range(59):
        n._take(f"m{i}", 5, meta(f"m{i}", 0, 1))
    assert n.gap() == pytest.approx(59 / CLUSTER_RATE)  # about a heartbeat
    for i in range(59, 1000):
        n._take(f"m{i}", 5, meta(f"m{i}", 0, 1))
    # 1,000 members at most CLUSTER_RATE summaries a second between them
    assert n.gap() == pytest.approx(1000 / CLUSTER_RATE)
    assert 1000 / n.gap() <= CLUSTER_RATE
