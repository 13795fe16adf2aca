"""The memory store's registered experts: one session each, with a lease and a heartbeat."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from contend.store._common import live_elsewhere, session_not_live
from contend.store.port import ExpertInfo, ExpertRecord, Heartbeat


@dataclass(slots=True)
class ExpertEntry:
    """One registered expert: its current session, lease and last heartbeat."""

    info: ExpertInfo
    session: str
    lease_deadline: float
    heartbeat_at: float
    started_at: float
    beat: Heartbeat = field(default_factory=Heartbeat)

    def record(self, now: float) -> ExpertRecord:
        return ExpertRecord(
            info=self.info,
            session=self.session,
            alive=self.lease_deadline >= now,
            load=self.beat.load,
            lease_deadline=self.lease_deadline,
            heartbeat_at=self.heartbeat_at,
            started_at=self.started_at,
            claim_attempts=self.beat.claim_attempts,
            claims_won=self.beat.claims_won,
            tasks_done=self.beat.tasks_done,
            metrics=dict(self.beat.metrics),
        )


class Sessions:
    """Experts by id. A session is live while its lease lasts; one lapsed an hour is forgotten."""

    __slots__ = ("_experts",)

    def __init__(self) -> None:
        self._experts: dict[str, ExpertEntry] = {}

    def register(self, info: ExpertInfo, now: float, ttl: float) -> tuple[str, float | None]:
        """A new session for *info*, and the lease deadline of the lapsed one it replaces
        (None if there was none). Refused while another session of that id is live."""
        old = self._experts.get(info.id)
        if old is not None and old.lease_deadline >= now:
            raise live_elsewhere(info.id, old.info.host, old.info.pid)
        session = uuid.uuid4().hex
        self._experts[info.id] = ExpertEntry(info, session, now + ttl, now, now)
        return session, None if old is None else old.lease_deadline

    def deregister(self, expert: str, session: str, now: float) -> None:
        """End *session*'s lease now (a stale session is ignored)."""
        e = self._experts.get(expert)
        if e is not None and e.session == session:
            e.lease_deadline = min(e.lease_deadline, now - 1e-6)
            e.beat = replace(e.beat, load=0)

    def end(self, expert: str, session: str, now: float) -> bool:
        """End *session* now if it is *expert*'s current one; whether it was."""
        e = self._experts.get(expert)
        if e is None or e.session != session:
            return False
        e.lease_deadline = min(e.lease_deadline, now - 1e-6)
        e.beat = replace(e.beat, load=0)
        return True

    def live(self, expert: str, session: str, now: float) -> ExpertEntry:
        """The entry of *expert* if *session* is its live session, else refuse."""
        e = self._experts.get(expert)
        if e is None or e.session != session or e.lease_deadline < now:
            raise session_not_live(expert, session)
        return e

    def session_live(self, expert: str, session: str | None, now: float) -> bool:
        """Whether *session* is *expert*'s live session."""
        e = self._experts.get(expert)
        return e is not None and e.session == session and e.lease_deadline >= now

    def is_live(self, expert: str, now: float) -> bool:
        """Whether *expert* has a live session, whichever it is."""
        e = self._experts.get(expert)
        return e is not None and e.lease_deadline >= now

    def records(self, now: float) -> list[ExpertRecord]:
        return [e.record(now) for e in sorted(self._experts.values(), key=lambda e: e.info.id)]

    def forget_lapsed(self, before: float) -> None:
        """Drop the experts whose lease ended before *before*."""
        for eid in [k for k, e in self._experts.items() if e.lease_deadline < before]:
            del self._experts[eid]
