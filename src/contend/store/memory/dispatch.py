"""Central queues in the memory store: leaderships by name, assignments under a term, the
leader's read and the claim of a task given to an expert (``contend.domain.dispatch`` decides;
this applies, between two awaits, which is atomic in one event loop)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from contend.domain import dispatch as rules
from contend.domain.limits import admit
from contend.domain.task import Capabilities, TaskEvent
from contend.store.memory.index import TaskIndex
from contend.store.memory.records import HISTORY_LIMIT, Row, view_of
from contend.store.memory.sessions import Sessions
from contend.store.port import CentralBacklog


class Leaders:
    """The leaderships of one memory store, and the central tasks' assignments."""

    __slots__ = ("_held", "_index", "_sessions", "_tasks")

    def __init__(self, tasks: Mapping[str, Row], index: TaskIndex, sessions: Sessions) -> None:
        self._held: dict[str, rules.Leadership] = {}
        self._tasks = tasks
        self._index = index
        self._sessions = sessions

    def _current(self, name: str, now: float) -> tuple[rules.Leadership | None, bool]:
        cur = self._held.get(name)
        if cur is None or cur.holder is None:
            return cur, False
        return cur, self._sessions.session_live(cur.holder, cur.session, now)

    def lead(self, expert: str, session: str, name: str, ttl: float, now: float) -> int | None:
        self._sessions.live(expert, session, now)
        current, live = self._current(name, now)
        granted = rules.decide_lead(current, expert, session, now, ttl, holder_live=live)
        if granted is None:
            return None
        self._held[name] = rules.Leadership(name, expert, session, granted.term, granted.deadline)
        return granted.term

    def assign(
        self,
        expert: str,
        session: str,
        name: str,
        term: int,
        plan: Mapping[str, str],
        now: float,
    ) -> int:
        current, live = self._current(name, now)
        refused = rules.assign_refusal(name, current, expert, session, term, now, holder_live=live)
        if refused is not None:
            raise refused
        detail = rules.assigned_detail(expert, term)
        given = 0
        for tid, who in plan.items():
            row = self._tasks.get(tid)
            if row is None or not row.spec.central or tid not in self._pending(row):
                continue
            if row.assignee is not None and self._sessions.is_live(row.assignee, now):
                continue
            row.assignee = who
            row.history.append(TaskEvent(now, rules.ASSIGNED, row.fence, who, detail))
            if len(row.history) > HISTORY_LIMIT:
                del row.history[1 : len(row.history) - HISTORY_LIMIT + 1]
            given += 1
        return given

    def _pending(self, row: Row) -> dict[str, None]:
        return self._index.central.get(row.spec.queue, {})

    def backlog(
        self, queues: Sequence[str], live: Collection[str], limit: int, now: float
    ) -> CentralBacklog:
        alive = set(live)
        assigned: dict[str, int] = {}
        need: list[tuple[tuple[int, float, str], str]] = []
        for q in dict.fromkeys(queues):
            for tid in self._index.central.get(q, {}):
                row = self._tasks[tid]
                if row.assignee is not None and row.assignee in alive:
                    assigned[row.assignee] = assigned.get(row.assignee, 0) + 1
                elif row.run_at <= now:
                    need.append(((-row.aged, row.run_at, tid), tid))
        need.sort()
        views = [view_of(tid, self._tasks[tid]) for _, tid in need[:limit]]
        held: dict[str, int] = {}
        for tid in self._index.held:
            owner = self._tasks[tid].owner
            if owner is not None and owner in alive:
                held[owner] = held.get(owner, 0) + 1
        return CentralBacklog(views, assigned, held)

    def mine(
        self,
        expert: str,
        queues: Sequence[str],
        caps: Capabilities,
        now: float,
        limit: int,
        *,
        ids: Collection[str] | None,
        types: Collection[str] | None,
        without: Collection[str],
        held: Mapping[str, int] | None,
        rooms: Callable[[Collection[str | None]], Mapping[str, int]] | None = None,
    ) -> list[str]:
        """The central tasks given to *expert* that it may claim now, in claim order, their
        keys' limits kept (*rooms*: the starts each rate-limited key of those given allows)."""
        picks: list[tuple[tuple[int, float, str], str]] = []
        for q in dict.fromkeys(queues):
            for tid in self._index.central.get(q, {}):
                row = self._tasks[tid]
                if (
                    row.assignee == expert
                    and row.run_at <= now
                    and (ids is None or tid in ids)
                    and (types is None or row.spec.type in types)
                    and tid not in without
                    and caps.satisfies(row.spec.requirements)
                ):
                    picks.append(((-row.aged, row.run_at, tid), tid))
        picks.sort()
        chosen = [tid for _, tid in picks]
        if held is None:
            return chosen[:limit]
        rows = self._tasks
        keyed = [(t, rows[t].spec.limit_key, rows[t].spec.concurrency_limit) for t in chosen]
        room = None if rooms is None else rooms({k for _, k, _ in keyed})
        return admit(keyed, held, limit, room)
