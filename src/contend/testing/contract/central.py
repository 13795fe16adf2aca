"""Central queues (``contend.domain.dispatch``), where the backend promises them
(``Promises.central_dispatch``): a leadership taken and renewed through the store, a term that
grows each time it changes hands, an assignment from an old term refused with nothing
written, and a central task claimable by its assignee alone. A backend that does not promise
them is refused by the app: a task of a central queue is never written to it.

Part of the contract: every backend registered in ``backends.py`` must pass it.
"""

from __future__ import annotations

from typing import cast

import pytest

from contend.domain.dispatch import ASSIGNED, term_of
from contend.domain.limits import Rate
from contend.domain.task import TaskSpec
from contend.errors import ConfigError, LeaseLost, NotLeader
from contend.runtime.app import App
from contend.store.port import CentralDispatch, Completion
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import Expert, P, join, pass_time, snapshot, spec

Q = "central"


def central(*args: int, **options: object) -> TaskSpec:
    return spec("job", *args, queue=Q, central=True, **options)


async def _refused(h: Harness) -> CentralDispatch | None:
    """The store as a :class:`CentralDispatch` where it promises central dispatch; otherwise
    check that the app refuses a central queue's task on it, writing nothing, and say so
    (None: the test has nothing more to check)."""
    store = h.store
    if store.promises.central_dispatch:
        assert isinstance(store, CentralDispatch)
        return store
    app = App(store.url, store_factory=lambda _url: store)
    app.queue(Q, mode="central")

    @app.task(queue=Q)
    def job(n: int) -> int:
        return n

    with pytest.raises(ConfigError, match="central"):
        await app.submit(job, [1])
    with pytest.raises(ConfigError, match="central"):
        await app.submit_many([app.build_spec(job, [2])])
    assert await store.list_tasks() == []
    return None


async def _with(h: Harness, *specs: TaskSpec) -> list[str]:
    return [s.id for s in await h.store.submit(list(specs))]


async def _claim(e: Expert, limit: int = 5) -> list[str]:
    return [c.id for c in await e.claim(limit, queues=(Q, "default"))]


async def test_one_leader_at_a_time_and_the_term_grows_when_it_changes_hands(
    harness: Harness,
) -> None:
    h = harness
    d = await _refused(h)
    if d is None:
        return
    a, b = await join(h, "a"), await join(h, "b")
    assert await d.lead("a", a.session, Q, h.ttl) == 1
    assert await d.lead("b", b.session, Q, h.ttl) is None  # a holds it
    assert await d.lead("a", a.session, Q, h.ttl) == 1  # a renewal keeps the term
    assert await d.lead("b", b.session, "other", h.ttl) == 1  # names are independent
    # a keeps its session but stops renewing the leadership: it lapses, b takes it
    await pass_time(h, h.ttl * 1.5, a, b)
    assert await d.lead("b", b.session, Q, h.ttl) == 2
    assert await d.lead("a", a.session, Q, h.ttl) is None
    with pytest.raises(LeaseLost):  # a session that is not live may not lead
        await d.lead("a", "not-a-session", Q, h.ttl)


async def test_ending_the_leaders_session_frees_the_leadership_at_once(
    harness: Harness,
) -> None:
    h = harness
    d = await _refused(h)
    if d is None:
        return
    a, b = await join(h, "a"), await join(h, "b")
    assert await d.lead("a", a.session, Q, h.ttl) == 1
    supervisor = await h.new_store()
    await supervisor.end_session("a", a.session)
    assert await d.lead("b", b.session, Q, h.ttl) == 2  # no time passed
    c = await join(h, "c")
    await h.store.deregister_expert("b", b.session)
    assert await d.lead("c", c.session, Q, h.ttl) == 3


async def test_an_assignment_from_an_old_term_is_refused_and_writes_nothing(
    harness: Harness,
) -> None:
    h = harness
    d = await _refused(h)
    if d is None:
        return
    t1, t2 = await _with(h, central(1), central(2))
    a, b = await join(h, "a"), await join(h, "b")
    assert await d.lead("a", a.session, Q, h.ttl) == 1
    await pass_time(h, h.ttl * 1.5, a, b)  # a's leadership lapses, its session does not
    before = await snapshot(h.store)
    with pytest.raises(NotLeader) as lapsed:
        await d.assign("a", a.session, Q, 1, {t1: "a"})
    assert lapsed.value.reason == "lapsed"
    assert await d.lead("b", b.session, Q, h.ttl) == 2
    for who, session, term, reason in (
        ("a", a.session, 1, "stale_term"),  # the old leader, at its old term
        ("a", a.session, 2, "not_holder"),  # the right term, from the wrong expert
        ("b", b.session, 3, "stale_term"),  # a term that has not been
    ):
        with pytest.raises(NotLeader) as refused:
            await d.assign(who, session, Q, term, {t1: "a", t2: "a"})
        assert refused.value.reason == reason and refused.value.term == term
    with pytest.raises(NotLeader) as nobody:
        await d.assign("b", b.session, "never-led", 1, {t1: "b"})
    assert nobody.value.reason == "no_leader"
    assert await snapshot(h.store) == before
    assert await _claim(a) == [] and await _claim(b) == []
    # the current leader's assignment lands, its term in the history
    assert await d.assign("b", b.session, Q, 2, {t1: "a", t2: "b"}) == 2
    (line,) = [e for e in (await h.store.get(t1, history=True)).history if e.event == ASSIGNED]
    assert (line.expert, term_of(line.detail)) == ("a", 2)


async def test_a_central_task_is_claimed_by_its_assignee_alone(harness: Harness) -> None:
    h = harness
    d = await _refused(h)
    if d is None:
        return
    t1, t2, t3 = await _with(h, central(1), central(2), central(3))
    (plain,) = await _with(h, spec("job", 9))
    a, b = await join(h, "a"), await join(h, "b")
    # unassigned: nobody may claim it, named or not, and peek does not show it
    assert await _claim(a) == [plain]
    assert await b.claim(5, queues=(Q,), task_ids=[t1, t2, t3]) == []
    assert [v.id for v in await h.store.peek((Q,), a.capabilities, 10)] == []
    term = await d.lead("a", a.session, Q, h.ttl)
    assert term is not None
    assert await d.assign("a", a.session, Q, term, {t1: "b", t2: "b", t3: "a"}) == 3
    assert await b.claim(5, queues=(Q,), task_ids=[t3]) == []  # a's, not b's
    assert sorted(await _claim(b)) == sorted([t1, t2])
    got = await a.claim(5, queues=(Q,))
    assert [c.id for c in got] == [t3] and got[0].fence == 1
    # what each holds now, as the leader reads it (fresher than a heartbeat)
    backlog = await d.central_backlog((Q,), ["a", "b"], 10)
    assert (backlog.held, backlog.assigned, backlog.unassigned) == ({"a": 2, "b": 2}, {}, [])
    # the assignment is used up by the claim: a retry of the task waits for a new one
    assert await h.store.release("a", [(t3, got[0].fence)]) == [None]
    assert (await h.store.get(t3)).state == P
    # b took t1 and t2 in one claim: finishing one of them counts
    done = await h.store.complete("b", [Completion(t1, 1, "1")])
    assert done == [None]
    backlog = await d.central_backlog((Q,), ["a", "b"], 10)
    assert backlog.held == {"a": 1, "b": 1}
    assert await _claim(a) == []
    assert await d.assign("a", a.session, Q, term, {t3: "a"}) == 1
    assert await _claim(a) == [t3]


async def test_a_task_given_to_a_live_expert_stays_its_own(harness: Harness) -> None:
    h = harness
    d = await _refused(h)
    if d is None:
        return
    t1, t2 = await _with(h, central(1), central(2))
    a, b = await join(h, "a"), await join(h, "b")
    term = cast(int, await d.lead("a", a.session, Q, h.ttl))
    assert await d.assign("a", a.session, Q, term, {t1: "b", t2: "b"}) == 2
    assert await d.assign("a", a.session, Q, term, {t1: "a"}) == 0  # b is live: still b's
    backlog = await d.central_backlog((Q,), ["a", "b"], 10)
    assert (backlog.unassigned, backlog.assigned) == ([], {"b": 2})
    # b dies: its tasks are listed for a new assignment, and may be given again
    supervisor = await h.new_store()
    await supervisor.end_session("b", b.session)
    backlog = await d.central_backlog((Q,), ["a"], 10)
    assert [v.id for v in backlog.unassigned] == [t1, t2] and backlog.assigned == {}
    assert await d.assign("a", a.session, Q, term, {t1: "a", t2: "a"}) == 2
    assert sorted(await _claim(a)) == sorted([t1, t2])


async def test_the_leaders_read_lists_the_best_unassigned_first(harness: Harness) -> None:
    h = harness
    d = await _refused(h)
    if d is None:
        return
    low, high, later = central(1), central(2, priority=5), central(3, delay=h.ttl * 10)
    await _with(h, low, high, later, spec("job", 4))
    a = await join(h, "a")
    backlog = await d.central_backlog((Q, "default"), ["a"], 10)
    assert [v.id for v in backlog.unassigned] == [high.id, low.id]  # due only, best first
    assert [v.id for v in (await d.central_backlog((Q,), ["a"], 1)).unassigned] == [high.id]
    assert (await d.central_backlog(("default",), ["a"], 10)).unassigned == []
    del a


async def test_a_central_task_is_never_stolen(harness: Harness) -> None:
    h = harness
    d = await _refused(h)
    if d is None:
        return
    (t1,) = await _with(h, central(1))
    a, b = await join(h, "a"), await join(h, "b")
    term = cast(int, await d.lead("a", a.session, Q, h.ttl))
    assert await d.assign("a", a.session, Q, term, {t1: "a"}) == 1
    held = await a.claim(1, queues=(Q,), start=False)
    assert [c.id for c in held] == [t1]
    stolen = await h.store.steal(
        "b", b.session, "a", (Q,), b.capabilities, limit=5, lease_ttl=h.ttl
    )
    assert stolen == []
    assert await h.store.start("a", [(t1, held[0].fence)]) == [None]
    assert await h.store.complete("a", [Completion(t1, held[0].fence, "1")]) == [None]


async def test_a_central_task_keeps_its_rate_limit(harness: Harness) -> None:
    # the assignee's claim used to take every task given to it, whatever their key's rate
    h = harness
    d = await _refused(h)
    if d is None or not h.store.promises.rate_limits:
        return
    every = Rate.of((1, h.ttl))  # one start per ttl
    given = await _with(h, *(central(i, limit_key="k", rate_limit=every) for i in range(3)))
    (rated,) = await _with(h, spec("job", 9, limit_key="k", rate_limit=every))
    a = await join(h, "a")
    term = cast(int, await d.lead("a", a.session, Q, h.ttl))
    assert await d.assign("a", a.session, Q, term, dict.fromkeys(given, "a")) == 3
    first = await _claim(a)
    assert len(first) == 1 and first[0] in given, first  # one start of "k", not four
    assert await _claim(a) == []
    await pass_time(h, h.ttl, a)
    assert len(await _claim(a)) == 1
    assert rated not in first
