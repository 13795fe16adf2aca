"""The order an etcd claim tries fair candidates in (store/etcd/fair.py), without a server."""

from __future__ import annotations

from contend.store.etcd.fair import Found, fair_pick


def _found(key: str, n: int, due0: int) -> list[Found]:
    return [(f"{key}{i}", (-5, f"{due0 + i:020d}", f"{key}{i}"), ("default", 5)) for i in range(n)]


def test_a_claims_fallbacks_are_as_fair_as_its_first_tries() -> None:
    # tenant a's burst was due first and holds 16 slots; tenant b just came with 8 tasks
    found = sorted(_found("a", 8, 0) + _found("b", 8, 100), key=lambda f: f[1])
    fairs = {tid: tid[0] for tid, _, _ in found}
    order = fair_pick(found, fairs, {"a": 16, "b": 0}, limit=4, lane=[])
    # the first four tried are b's, and so are the next four, tried when rivals won the
    # first: a claim that lost b's heads to rivals must not fall back on a's tasks
    assert order[:8] == [f"b{i}" for i in range(8)]
    assert sorted(order) == sorted(fairs)


def test_keys_even_out_once_the_newcomer_has_its_share() -> None:
    found = sorted(_found("a", 8, 0) + _found("b", 8, 100), key=lambda f: f[1])
    fairs = {tid: tid[0] for tid, _, _ in found}
    order = fair_pick(found, fairs, {"a": 3, "b": 1}, limit=4, lane=[])
    # b's two first heads bring it level with a, then the two alternate
    assert order[:6] == ["b0", "b1", "a0", "b2", "a1", "b3"]
