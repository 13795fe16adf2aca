"""Expert sessions: register, renew (the expert's lease and those of its claims, one
heartbeat), deregister, and the liveness check claims and bids make."""

from __future__ import annotations

import json
import uuid

from contend.store._common import check_ttl, live_elsewhere, session_not_live
from contend.store.port import ExpertInfo, Heartbeat
from contend.store.postgres.database import Cursor, Database, one


async def check_session(db: Database, cur: Cursor, expert: str, session: str) -> None:
    """Raise LeaseLost unless *session* is *expert*'s live session."""
    await cur.execute(
        db.sql(
            "SELECT 1 FROM {s}.experts WHERE id = %(expert)s AND session = %(session)s "
            "AND lease_deadline >= {now}"
        ),
        db.params(expert=expert, session=session),
    )
    if await cur.fetchone() is None:
        raise session_not_live(expert, session)


async def register_expert(db: Database, info: ExpertInfo, lease_ttl: float) -> str:
    ttl = check_ttl(lease_ttl)
    session = uuid.uuid4().hex

    async def run(cur: Cursor) -> None:
        # The old session's claims end with it: a new session never inherits them.
        await cur.execute(
            db.sql(
                "UPDATE {s}.tasks t SET lease_deadline = least(t.lease_deadline, "
                "e.lease_deadline) FROM {s}.experts e WHERE e.id = %(id)s "
                "AND e.lease_deadline < {now} AND t.owner = e.id "
                "AND t.state IN ('claimed', 'running')"
            ),
            db.params(id=info.id),
        )
        await cur.execute(
            db.sql(
                "INSERT INTO {s}.experts AS e (id, session, info, lease_deadline, "
                "heartbeat_at, started_at) VALUES (%(id)s, %(session)s, %(info)s, "
                "{now} + %(ttl)s, {now}, {now}) "
                "ON CONFLICT (id) DO UPDATE SET session = excluded.session, "
                "info = excluded.info, lease_deadline = excluded.lease_deadline, "
                "heartbeat_at = excluded.heartbeat_at, started_at = excluded.started_at, "
                "load = 0, claim_attempts = 0, claims_won = 0, tasks_done = 0, metrics = '{}' "
                "WHERE e.lease_deadline < {now} RETURNING 1"
            ),
            db.params(id=info.id, session=session, info=info.to_json_text(), ttl=ttl),
        )
        if await cur.fetchone() is not None:
            return
        await cur.execute(db.sql("SELECT info FROM {s}.experts WHERE id = %s"), (info.id,))
        other = ExpertInfo.from_json_text(one(await cur.fetchone())[0])
        raise live_elsewhere(info.id, other.host, other.pid)

    await db.run(run)
    return session


async def renew(
    db: Database, expert: str, session: str, lease_ttl: float, beat: Heartbeat
) -> dict[str, int]:
    ttl = check_ttl(lease_ttl)

    async def run(cur: Cursor) -> dict[str, int]:
        await cur.execute(
            db.sql(
                "UPDATE {s}.experts SET lease_deadline = {now} + %(ttl)s, "
                "heartbeat_at = {now}, load = %(load)s, claim_attempts = %(attempts)s, "
                "claims_won = %(won)s, tasks_done = %(done)s, metrics = %(metrics)s "
                "WHERE id = %(expert)s AND session = %(session)s "
                "AND lease_deadline >= {now} RETURNING 1"
            ),
            db.params(
                ttl=ttl,
                load=beat.load,
                attempts=beat.claim_attempts,
                won=beat.claims_won,
                done=beat.tasks_done,
                metrics=json.dumps(dict(beat.metrics)),
                expert=expert,
                session=session,
            ),
        )
        if await cur.fetchone() is None:
            raise session_not_live(expert, session)
        await cur.execute(
            db.sql(
                # in id order, as every owner write takes its rows (apply.apply): two
                # writers of one expert's tasks never wait on each other in a cycle
                "WITH held AS (SELECT id FROM {s}.tasks WHERE owner = %(expert)s "
                "AND state IN ('claimed', 'running') AND lease_deadline >= {now} "
                "ORDER BY id FOR UPDATE) "
                "UPDATE {s}.tasks t SET lease_deadline = {now} + %(ttl)s FROM held "
                "WHERE t.id = held.id RETURNING t.id, t.fence"
            ),
            db.params(ttl=ttl, expert=expert),
        )
        return {r[0]: r[1] for r in await cur.fetchall()}

    return await db.run(run)


async def deregister_expert(db: Database, expert: str, session: str) -> None:
    async def run(cur: Cursor) -> None:
        await cur.execute(
            db.sql(
                "UPDATE {s}.experts SET lease_deadline = least(lease_deadline, "
                "{now} - 1e-6), load = 0 WHERE id = %(expert)s AND session = %(session)s"
            ),
            db.params(expert=expert, session=session),
        )

    await db.run(run, tx=False)
