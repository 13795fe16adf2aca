"""A claim that met limit keys or fair tasks, made again in a transaction (see
:class:`Limited`), and the CTEs every claim shares with it (the session, the update)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contend.domain.limits import admit, rooms
from contend.store.port import Claimed
from contend.store.postgres.database import NOW_LIVE, Cursor, Database
from contend.store.postgres.limits import (
    KEY_STATES,
    SPEND,
    Pick,
    fair_params,
    fair_picks,
    in_fair_order,
    key_states,
    spend_params,
)
from contend.store.postgres.rows import CLAIMED_COLUMNS, claimed
from contend.store.postgres.sessions import check_session

BEST = "eff_priority DESC, run_at, id"


def live_cte(live: bool = False) -> str:
    """CTE ``live``: the claimer's session, held shared so that it cannot be replaced."""
    now = "{now_live}" if live else "{now}"
    return (
        "live AS ("
        "  SELECT 1 FROM {s}.experts WHERE id = %(expert)s AND session = %(session)s"
        f"   AND lease_deadline >= {now} FOR SHARE)"
    )


def take_ctes(picked: str, *, live: bool = False) -> str:
    """CTEs ``claimed`` (the tasks of ``picked`` handed to the claimer) and ``events`` (their
    history lines); *picked* is what the update may take, as the ``picked`` CTE's condition
    (``FROM picked WHERE t.id = picked.id AND …``). A claim uses up a central task's
    assignment: should the task be pending again, a leader gives it anew."""
    now = "{now_live}" if live else "{now}"
    return (
        "claimed AS ("
        "  UPDATE {s}.tasks t SET %(assign)s, owner = %%(expert)s, fence = t.fence + 1,"
        "   assignee = NULL,"
        f"   lease_deadline = {now} + %%(ttl)s, updated_at = {now}"
        f"  FROM picked WHERE t.id = picked.id{picked}"
        f"  RETURNING {CLAIMED_COLUMNS}"
        "), events AS ("
        "  INSERT INTO {s}.task_events (task_id, at, event, fence, expert, detail)"
        "  SELECT %(line)s FROM claimed)"
    )


class Limited:
    """A claim that met limit keys or fair tasks, made again in a transaction.

    A claim that would take a task of a limited key (a concurrency limit, or a rate) first
    takes that key's advisory lock (``pg_advisory_xact_lock(hashtextextended(key, 0))``,
    held to its commit), then reads the key's claimed and running tasks and its rate state
    (``rate_keys.tat``) in a statement begun after the lock: every other claim of that key
    either committed before (and is counted, its starts spent) or waits for this one. So two
    claims never both take a key's last slot, nor its rate's last start, and the rate is
    spent (``tat`` moved on) in the same transaction as the update. The locks named by the
    first statement are taken in hash order, waiting (no deadlock: nothing else is held
    yet); a key met only in the wider pick is tried without waiting, and its tasks left out
    if another claim holds it. Fair-only keys take no lock: their counts only rank.

    Without fair tasks the pick is widened (``8 × limit + 64``), by effective priority alone
    as SQLite's and the memory store's limited claims are. With them, the candidates are the
    low lane's, then the heads of each queue's fair keys and the best without one
    (:func:`~contend.store.postgres.limits.fair_sql`) in fair order. Either way the central
    tasks a leader gave the claimer (``mine``) come before all of those, and
    :func:`contend.domain.limits.admit` chooses, in that order, the first ``limit`` their
    keys admit: an assigned task waits for its key's room as any other does."""

    def __init__(
        self,
        db: Database,
        pick_sql: str,
        take: str,
        params: dict[str, Any],
        *,
        fair: bool,
        named: bool,
        queues: Sequence[str],
    ) -> None:
        self.db = db
        self.fair, self.named = fair, named
        self.queues = list(queues)
        self.want = int(params["limit"])
        self.params = params if fair else {**params, "limit": self.want * 8 + 64, "lane": 0}
        self.expert, self.session = str(params["expert"]), str(params["session"])
        self.pick_sql = db.sql(pick_sql, live=True).replace("{now_live}", NOW_LIVE)
        self.take_sql = db.sql(
            f"WITH picked AS (SELECT unnest(%(chosen)s::text[]) AS id), {take}, {SPEND}"
            f" SELECT * FROM claimed ORDER BY {BEST}",
            live=True,
        ).replace("{now_live}", NOW_LIVE)
        self.lock_sql = db.sql(
            "SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT hashtextextended(k, 0) AS h"
            " FROM unnest(%(keys)s::text[]) AS k ORDER BY h) l"
        )
        self.try_sql = db.sql(
            "SELECT k FROM unnest(%(keys)s::text[]) AS k"
            " WHERE pg_try_advisory_xact_lock(hashtextextended(k, 0))"
        )
        self.states_sql = db.sql(KEY_STATES, live=True)

    async def claim(self, cur: Cursor, keys: Sequence[str]) -> list[Claimed]:
        db = self.db
        if keys:
            await cur.execute(self.lock_sql, {"keys": list(keys)})
        cursor = db.fair_cursor
        extra = fair_params(self.queues, cursor, self.want) if self.fair else {}
        await cur.execute(self.pick_sql, db.params(**self.params, **extra))
        walked = cursor if self.fair and not self.named else None  # the rotation moves on
        found = await cur.fetchall()
        # the central tasks given to the claimer first, then the lane's, then the others
        mine = sorted((Pick.of(r[1:]) for r in found if r[0] == "mine"), key=lambda p: p.best)
        lane, rest = fair_picks((r for r in found if r[0] != "mine"), walked, self.queues)
        locked = set(keys)
        seen = {p.limit_key for p in [*mine, *lane, *rest] if p.limited and p.limit_key}
        met = sorted(seen - locked)
        if met:  # keys the first statement did not meet: only those free now
            await cur.execute(self.try_sql, {"keys": met})
            locked.update(r[0] for r in await cur.fetchall())
        fair_keys = {p.fair_key for p in rest if p.fair_key is not None}
        held: dict[str, int] = {}
        rates: dict[str, Any] = {}
        now = 0.0
        if locked or fair_keys:  # read after the locks
            await cur.execute(self.states_sql, db.params(keys=sorted(locked | fair_keys)))
            held, rates, now = key_states(await cur.fetchall())
        rates = {k: v for k, v in rates.items() if k in locked}
        ordered = [*mine, *lane, *(in_fair_order(rest, held) if self.fair else rest)]
        usable = [p for p in ordered if not p.limited or p.limit_key in locked]
        chosen = admit(
            ((p.id, p.limit_key, p.limit_max) for p in usable), held, self.want, rooms(rates, now)
        )
        rows = []
        if chosen:
            by_id = {p.id: p for p in usable}
            spent = spend_params(rates, (by_id[i].limit_key for i in chosen), now)
            # a rate was spent at `now`: the claim is recorded at that moment, not at the
            # take's own (later by however long this transaction took in between)
            at = now if spent["spent_keys"] else None
            params = db.params(**self.params, **spent, chosen=chosen, decided_at=at)
            await cur.execute(self.take_sql, params)
            rows = await cur.fetchall()
        if not rows:
            await check_session(db, cur, self.expert, self.session)
        return [claimed(r) for r in rows]
