"""Auctions: the first bid on a pending task opens its bidding window and fixes its grace;
every bid returns the ranking so far. Claims keep the order the ranking sets
(:data:`NOT_HELD`, used by ``claims``). :func:`~contend.store.postgres.housekeeping.expire`
deletes the auctions of tasks no longer pending."""

from __future__ import annotations

from contend.domain import auction
from contend.errors import StoreError, TaskNotFound
from contend.store._common import check_bid
from contend.store.port import Auction
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.sessions import check_session

#: The bids of auction ``a`` ranked ahead of ``%(expert)s``'s (all of them when it did not
#: bid): its place, ``contend.domain.auction.rank``. Best first is the higher score, then the
#: earlier bid, then the name in code point order (``COLLATE "C"``, as Python sorts).
RANK = (
    "(SELECT count(*) FROM {s}.bids b"
    " LEFT JOIN {s}.bids m ON m.task_id = b.task_id AND m.expert = %(expert)s"
    " WHERE b.task_id = a.task_id AND (m.expert IS NULL"
    '  OR (-b.score, b.at, b.expert COLLATE "C") < (-m.score, m.at, m.expert)))'
)

#: The condition on a task ``t`` that no auction holds ``%(expert)s`` back from it
#: (``contend.domain.auction.may_claim_at``): no auction, or one closed at least its rank's
#: turns of grace ago. Before the close the bids are not read.
#:
#: A scalar subquery, not ``NOT EXISTS``: the planner turns that into an anti-join against a
#: materialized scan of every auction (it cannot cost the rank), which computes every rank
#: and is then searched once per task walked; behind 1,000 auctions a claim took 7 to 57 ms.
#: A scalar subquery stays a probe of the auctions' primary key per task walked.
NOT_HELD = (
    "NOT coalesce((SELECT {now} < a.closes_at OR {now} < a.closes_at + a.grace * "
    f"{RANK} FROM {{s}}.auctions a WHERE a.task_id = t.id), false)"
)


async def bid(
    db: Database,
    expert: str,
    session: str,
    task_id: str,
    score: float,
    window: float,
    grace: float = auction.DEFAULT_GRACE,
) -> Auction:
    score, window, grace = check_bid(score, window, grace)

    async def run(cur: Cursor) -> Auction:
        await check_session(db, cur, expert, session)
        # held shared until the commit: a claim skips the task while a bid is placed
        await cur.execute(
            db.sql(
                "SELECT {now}, t.state, a.closes_at, a.grace FROM {s}.tasks t "
                "LEFT JOIN {s}.auctions a ON a.task_id = t.id WHERE t.id = %(id)s "
                "FOR SHARE OF t"
            ),
            db.params(id=task_id),
        )
        row = await cur.fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        now, state, closes, kept = row
        if state != "pending":
            closes, kept = (now, grace) if closes is None else (closes, kept)
            return Auction(task_id, now, closes, (), open=False, grace=kept)
        if closes is None:  # the first bid: concurrent first bids agree on one auction
            # (and the store has auctions from now on: the claims' lean statement, which
            # leaves their order out, is refused from this commit on)
            await cur.execute(
                db.sql(
                    "WITH used AS (INSERT INTO {s}.features (name) VALUES ('auctions')"
                    " ON CONFLICT DO NOTHING)"
                    " INSERT INTO {s}.auctions (task_id, closes_at, grace)"
                    " VALUES (%(id)s, {now} + %(window)s, %(grace)s) ON CONFLICT DO NOTHING",
                    live=True,
                ),
                db.params(id=task_id, window=window, grace=grace),
            )
        # A new statement, so that it sees the auction a concurrent first bid opened. The bid
        # is ranked only before the close (a repeated one keeps its place in time), and the
        # ranking is read back in the same statement: its time is taken as late as it can
        # be, one round trip (the commit) before the bid is seen by claims.
        await cur.execute(
            db.sql(
                "WITH placed AS ("
                "  INSERT INTO {s}.bids (task_id, expert, score, at)"
                "  SELECT a.task_id, %(expert)s, %(score)s, {now} FROM {s}.auctions a"
                "  WHERE a.task_id = %(id)s AND {now} < a.closes_at"
                "  ON CONFLICT (task_id, expert) DO UPDATE SET score = excluded.score"
                "  RETURNING expert, score, at"
                "), bids AS ("
                "  SELECT expert, score, at FROM placed UNION ALL"
                "  SELECT expert, score, at FROM {s}.bids WHERE task_id = %(id)s"
                "   AND expert NOT IN (SELECT expert FROM placed)"
                ") SELECT {now}, a.closes_at, a.grace, b.expert, b.score, b.at"
                " FROM {s}.auctions a LEFT JOIN bids b ON true WHERE a.task_id = %(id)s",
                live=True,
            ),
            db.params(id=task_id, expert=expert, score=score),
        )
        rows = await cur.fetchall()
        if not rows:
            raise StoreError(f"the auction of task {task_id} vanished while a bid was placed")
        ranked = auction.rank_bids({r[3]: (r[4], r[5]) for r in rows if r[3] is not None})
        at, closes, kept = rows[0][:3]
        return Auction(task_id, at, closes, ranked, grace=kept)

    return await db.run(run)
