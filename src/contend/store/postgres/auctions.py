"""Auctions: the first bid on a pending task opens its bidding window; every bid returns the
ranking so far. :func:`~contend.store.postgres.housekeeping.expire` deletes the auctions of
tasks no longer pending."""

from __future__ import annotations

from contend.errors import TaskNotFound
from contend.store._common import check_bid, rank_bids
from contend.store.port import Auction
from contend.store.postgres.database import Cursor, Database
from contend.store.postgres.sessions import check_session


async def bid(
    db: Database, expert: str, session: str, task_id: str, score: float, window: float
) -> Auction:
    score, window = check_bid(score, window)

    async def run(cur: Cursor) -> Auction:
        await check_session(db, cur, expert, session)
        await cur.execute(
            db.sql(
                "SELECT {now}, t.state, a.closes_at FROM {s}.tasks t "
                "LEFT JOIN {s}.auctions a ON a.task_id = t.id WHERE t.id = %(id)s "
                "FOR SHARE OF t"
            ),
            db.params(id=task_id),
        )
        row = await cur.fetchone()
        if row is None:
            raise TaskNotFound(task_id)
        now, state, closes = row
        if state != "pending":
            return Auction(task_id, now, now if closes is None else closes, (), open=False)
        # The first bid opens the auction; a repeated bid keeps its place in time.
        await cur.execute(
            db.sql(
                "WITH opened AS ("
                "  INSERT INTO {s}.auctions (task_id, closes_at)"
                "  VALUES (%(id)s, {now} + %(window)s) ON CONFLICT DO NOTHING"
                "), placed AS ("
                "  INSERT INTO {s}.bids (task_id, expert, score, at)"
                "  VALUES (%(id)s, %(expert)s, %(score)s, {now})"
                "  ON CONFLICT (task_id, expert) DO UPDATE SET score = excluded.score"
                ") SELECT 1"
            ),
            db.params(id=task_id, window=window, expert=expert, score=score),
        )
        # a separate statement, to see this bid and every other committed one
        await cur.execute(
            db.sql(
                "SELECT a.closes_at, b.expert, b.score, b.at FROM {s}.auctions a "
                "LEFT JOIN {s}.bids b ON b.task_id = a.task_id WHERE a.task_id = %s"
            ),
            (task_id,),
        )
        rows = await cur.fetchall()
        bids = {r[1]: (r[2], r[3]) for r in rows if r[1] is not None}
        return Auction(task_id, now, rows[0][0], rank_bids(bids))

    return await db.run(run)
