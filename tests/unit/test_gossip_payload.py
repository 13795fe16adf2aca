"""The gossip summary: what competition reads of a rival, within a byte budget; a malformed
one is ignored whole."""

from __future__ import annotations

import pytest

from contend.domain.loadmap import Entry, canonical, entry
from contend.domain.task import Capabilities
from contend.errors import ConfigError
from contend.gossip.payload import BUDGET, record, summary
from contend.runtime.competition import expert_view
from contend.store.port import ExpertInfo

INFO = ExpertInfo(
    id="e1",
    capabilities=Capabilities(frozenset({"gpu"}), {"mem_gb": 16.0}),
    queues=("default", "render"),
    capacity=8,
    tier="specialized",
)


def test_a_summary_round_trips_to_what_competition_reads() -> None:
    metrics = {
        "types": {"app.resize": [10, 1, 0.25]},
        "specialties": ["app.resize"],
        "prefetched": 2,
        "active": True,
        "window": 0.02,  # not carried: competition does not read it of a rival
    }
    s = summary(INFO, 3, metrics)
    rec = record(entry(7, 1, s), heard_at=100.0, started_at=50.0)
    assert rec is not None
    assert rec.info.id == "e1" and rec.info.queues == ("default", "render")
    assert rec.info.capabilities == INFO.capabilities
    assert (rec.info.capacity, rec.info.tier, rec.load, rec.alive) == (8, "specialized", 3, True)
    assert rec.session == "gossip:7" and rec.heartbeat_at == 100.0
    assert rec.metrics == {
        "types": {"app.resize": [10, 1, 0.25]},
        "specialties": ["app.resize"],
        "prefetched": 2,
    }
    view = expert_view(rec, {})
    assert view.specialties == frozenset({"app.resize"})
    assert view.history["app.resize"].done == 10


def test_an_emergency_expert_says_whether_it_is_active() -> None:
    info = ExpertInfo(id="x", tier="emergency")
    on = record(entry(1, 1, summary(info, 0, {"active": True})), heard_at=0, started_at=0)
    off = record(entry(1, 1, summary(info, 0, {})), heard_at=0, started_at=0)
    assert on is not None and on.metrics["active"] is True
    assert off is not None and off.metrics["active"] is False


def test_history_is_cut_to_the_budget_keeping_the_most_run_types() -> None:
    types = {f"app.type_{n:03d}": [n, 0, 0.5] for n in range(200)}
    s = summary(INFO, 0, {"types": types, "specialties": ["a"]})
    assert len(canonical(s).encode()) <= BUDGET
    kept = s["y"]
    assert 0 < len(kept) < 200
    assert min(v[0] for v in kept.values()) > max(v[0] for k, v in types.items() if k not in kept)


def test_queues_and_capabilities_that_do_not_fit_are_refused() -> None:
    info = ExpertInfo(id="big", queues=tuple(f"q{n:04d}" for n in range(200)))
    with pytest.raises(ConfigError, match="more than the 960 a gossip summary holds"):
        summary(info, 0, {})


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "[1, 2]",
        "not json",
        canonical({"q": ["a"], "c": 1, "t": "general", "l": 0}),  # no id
        canonical({"id": "x", "q": "a", "c": 1, "t": "general", "l": 0}),
        canonical({"id": "x", "q": ["a"], "c": -1, "t": "general", "l": 0}),
        canonical({"id": "x", "q": ["a"], "c": 1, "t": "general", "l": True}),
        canonical({"id": "x", "q": ["a"], "c": 1, "t": 3, "l": 0}),
        canonical({"id": "x", "q": ["a"], "c": 1, "t": "general", "l": 0, "k": {"tags": "g"}}),
        canonical(
            {"id": "x", "q": ["a"], "c": 1, "t": "general", "l": 0, "k": {"resources": {"m": "1"}}}
        ),
    ],
)
def test_a_malformed_summary_is_ignored(bad: str | None) -> None:
    assert record(Entry(1, 1, bad), heard_at=0, started_at=0) is None
