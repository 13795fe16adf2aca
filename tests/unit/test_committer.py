"""The committer on a memory store and a fake clock: batches, refusals, retries, lost sessions."""

from __future__ import annotations

import pytest

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.runtime.committer import BACKOFF, Committer
from contend.runtime.hooks import Hooks
from contend.runtime.session import Session
from contend.store.port import Claimed, Completion, ExpertInfo, Failure
from contend.testing import FakeClock
from contend.testing.faults import FaultyStore
from tests.unit.fakes import Recorder, faulty_memory

TTL = 30.0


class Bench:
    def __init__(self) -> None:
        self.clock = FakeClock(0.0)
        self.store: FaultyStore = faulty_memory(self.clock)
        self.hook = Recorder(self.clock)
        self.lost: list[tuple[Session, str]] = []
        self.dropped: list[int] = []
        self.session: Session | None = None
        self.committer = Committer(
            self.store,
            "c",
            clock=self.clock,
            hooks=Hooks([self.hook]),
            lose=self._lose,
            rand=lambda: 0.5,
        )

    def _lose(self, session: Session, reason: str) -> None:
        self.lost.append((session, reason))
        session.mark_lost("test")
        self.dropped.append(self.committer.drop(session))

    async def claim(self, n: int) -> tuple[Session, list[Claimed]]:
        if self.session is None:
            sid = await self.store.register_expert(ExpertInfo("c"), TTL)
            self.session = Session(sid, TTL, self.clock, self.clock.monotonic())
        await self.store.submit([TaskSpec.build("t") for _ in range(n)])
        got = await self.store.claim(
            "c", self.session.id, ["default"], Capabilities(), limit=n, lease_ttl=TTL
        )
        return self.session, got


@pytest.fixture
async def bench() -> Bench:
    b = Bench()
    b.committer.start()
    return b


async def test_outcomes_of_one_tick_go_in_one_call_per_kind(bench: Bench) -> None:
    session, tasks = await bench.claim(7)
    for c in tasks[:5]:
        bench.committer.send(Completion(c.id, c.fence, '"ok"'), session)
    for c in tasks[5:]:
        bench.committer.send(Failure(c.id, c.fence, "{}", None, TaskState.FAILED), session)
    assert bench.committer.pending_ids() == {c.id for c in tasks}
    await bench.clock.settle()
    assert (bench.store.calls["complete"], bench.store.calls["fail"]) == (1, 1)
    assert len(bench.hook.of("on_committed")) == 7 and bench.committer.pending_ids() == set()
    states = [(await bench.store.get(c.id)).state for c in tasks]
    assert states == [TaskState.SUCCEEDED] * 5 + [TaskState.FAILED] * 2
    # a later outcome is a batch of its own
    (late,) = (await bench.claim(1))[1]
    bench.committer.send(Completion(late.id, late.fence, "1"), session)
    await bench.clock.settle()
    assert bench.store.calls["complete"] == 2
    await bench.committer.close()


async def test_a_refused_outcome_is_reported_and_the_rest_lands(bench: Bench) -> None:
    session, (a, b) = await bench.claim(2)
    bench.committer.send(Completion(a.id, a.fence + 1, "1"), session)  # a stale fence
    bench.committer.send(Completion(b.id, b.fence, "2"), session)
    await bench.clock.settle()
    ((name, outcome, refusal),) = bench.hook.of("on_fenced_out")
    assert (name, outcome.task_id, refusal.task_id) == ("c", a.id, a.id)
    assert [o.task_id for _, o in bench.hook.of("on_committed")] == [b.id]
    await bench.committer.close()


async def test_store_errors_are_retried_with_back_off_on_the_clock(bench: Bench) -> None:
    session, (a,) = await bench.claim(1)
    bench.store.cut("complete")
    bench.committer.send(Completion(a.id, a.fence, "1"), session)
    await bench.clock.settle()
    assert bench.store.calls["complete"] == 1
    first = BACKOFF * 1.5  # rand() is 0.5
    await bench.clock.run(first - 0.001)
    assert bench.store.calls["complete"] == 1  # still backing off
    await bench.clock.run(0.001)
    assert bench.store.calls["complete"] == 2
    bench.store.heal()
    await bench.clock.run(2 * first)  # the second back-off doubles
    assert bench.store.calls["complete"] == 3
    assert [o.task_id for _, o in bench.hook.of("on_committed")] == [a.id]
    await bench.committer.close()


async def test_it_gives_up_after_a_few_tries(bench: Bench) -> None:
    session, (a,) = await bench.claim(1)
    bench.store.cut("complete")
    bench.committer.send(Completion(a.id, a.fence, "1"), session)
    await bench.clock.run(60)
    assert bench.store.calls["complete"] == 5
    assert bench.hook.of("on_committed") == [] and bench.committer.pending_ids() == set()
    await bench.committer.close()


async def test_nothing_of_a_lapsed_session_is_committed(bench: Bench) -> None:
    session, (a, b) = await bench.claim(2)
    bench.clock.advance(TTL)  # a whole lease with no renewal
    bench.committer.send(Completion(a.id, a.fence, "1"), session)
    bench.committer.send(Completion(b.id, b.fence, "2"), session)
    await bench.clock.settle()
    assert bench.lost == [(session, "no renewal within the lease")]  # declared once
    assert bench.dropped == [2] and bench.committer.pending_ids() == set()
    assert bench.store.calls.get("complete", 0) == 0
    assert bench.hook.of("on_committed") == []
    await bench.committer.close()


async def test_outcomes_of_a_session_lost_earlier_are_dropped(bench: Bench) -> None:
    session, (a,) = await bench.claim(1)
    session.mark_lost("test")  # lost by another part; this outcome slipped in after
    bench.committer.send(Completion(a.id, a.fence, "1"), session)
    await bench.clock.settle()
    assert bench.lost == [] and bench.store.calls.get("complete", 0) == 0
    assert bench.committer.pending_ids() == set()
    await bench.committer.close()


async def test_drop_forgets_only_the_lost_sessions_outcomes(bench: Bench) -> None:
    await bench.committer.close()  # stopped: sent outcomes wait in the outbox
    old, (a,) = await bench.claim(1)
    new = Session("other", TTL, bench.clock, 0.0)
    bench.committer.send(Completion(a.id, a.fence, "1"), old)
    bench.committer.send(Completion("x", 1, "1"), new)
    assert bench.committer.drop(old) == 1
    assert bench.committer.pending_ids() == {"x"}


async def test_close_commits_what_is_left(bench: Bench) -> None:
    session, (a,) = await bench.claim(1)
    bench.committer.send(Completion(a.id, a.fence, "1"), session)
    await bench.committer.close()
    assert (await bench.store.get(a.id)).state == TaskState.SUCCEEDED
