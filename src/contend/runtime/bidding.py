"""Auctions from the bidder's side (seed 000 §6.1): which task types are auctioned now, and
the bids an expert places on the lots it sees before it may claim them."""

from __future__ import annotations

import functools
from collections.abc import Collection

from contend.domain.scoring import TaskView
from contend.runtime.competition import Competition
from contend.runtime.config import ExpertConfig
from contend.runtime.executor import Executor
from contend.runtime.session import Session
from contend.runtime.task_type import TaskType
from contend.store.port import Auction, Store


def auction_types(
    tasks: Collection[TaskType], competition: Competition, threshold: float
) -> set[str]:
    """Task types to auction now: mode "auction", and mode "auto" once their runs take at
    least *threshold* seconds, so that an auction pays for itself (seed 000 §6.1)."""
    out = set()
    typical = competition.typical
    mine = competition.tracker.snapshot()
    for tt in tasks:
        if tt.mode == "auction":
            out.add(tt.name)
        elif tt.mode == "auto":
            mean = typical.get(tt.name) or (mine[tt.name].mean_seconds if tt.name in mine else None)
            if mean is not None and mean >= threshold:
                out.add(tt.name)
    return out


def below_top(views: list[TaskView]) -> list[TaskView]:
    """The candidates below the highest base priority among *views*: the low lane's."""
    top = max((v.priority for v in views), default=0)
    return [v for v in views if v.priority < top]


class Bidder:
    """One expert's auctions: what it knows of each lot it bid on, and when to look again."""

    def __init__(
        self,
        store: Store,
        name: str,
        config: ExpertConfig,
        competition: Competition,
        executor: Executor,
    ) -> None:
        self.store = store
        self.name = name
        self.config = config
        self.competition = competition
        self.executor = executor
        self.auctions: dict[str, tuple[Auction, bool]] = {}  # task -> (state, final)
        self.wake_at: float | None = None  # store time of the next auction moment

    async def entitled(
        self, session: Session, lots: list[TaskView], free: int, lane: int = 0
    ) -> list[str]:
        """Bid this expert's fitness on up to *free* of the *lots* (*lane* of them the low
        lane's: the longest waiting below the top priority); returns the ids it may claim now.
        After the close the top bidder may claim, and each next bidder after its grace period
        (the store refuses a claim out of turn)."""
        me = self.competition.me(self.executor.load)
        entitled: list[str] = []
        now = await session.call("a read", self.store.now)
        seen = {v.id for v in lots}
        for tid in [t for t in self.auctions if t not in seen]:
            del self.auctions[tid]  # claimed or gone: forget it (keeps the map bounded)
        low = sorted(below_top(lots), key=lambda v: (v.created_at, v.id))[: min(lane, free)]
        chosen = [v for v in lots if v not in low][: max(1, free) - len(low)] + low
        for view in chosen:
            state = self.auctions.get(view.id)
            if state is None or (not state[1] and now >= state[0].closes_at):
                score = self.config.fitness(me, view)
                bid = functools.partial(
                    self.store.bid,
                    self.name,
                    session.id,
                    view.id,
                    score,
                    self.config.auction_window,
                    self.config.auction_grace,
                )
                auction = await session.call("a bid", bid)
                state = (auction, auction.now >= auction.closes_at)
                self.auctions[view.id] = state
            auction, _ = state
            if not auction.open:
                continue
            at = auction.may_claim_at(self.name)  # the grace the first bid set
            if now >= at:
                entitled.append(view.id)
            else:
                wake = at if now >= auction.closes_at else auction.closes_at
                self.wake_at = min(self.wake_at or wake, wake)
        return entitled
