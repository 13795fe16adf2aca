"""Dependants of tasks that just ended: one fewer dependency left (pending when none is left),
or dead when a dependency did not succeed, and so on down the chain."""

from __future__ import annotations

from contend.store.postgres.database import Cursor, Database


async def settle_dependents(db: Database, cur: Cursor, done: list[tuple[str, str]]) -> None:
    """Tell the waiting dependents of tasks that just finished: one fewer dependency left
    (pending when none is left), or dead when a dependency did not succeed."""
    todo = list(done)
    woke = False
    while todo:
        ok = [tid for tid, state in todo if state == "succeeded"]
        bad = {tid: state for tid, state in todo if state != "succeeded"}
        todo = []
        if ok:
            woke = await _one_fewer(db, cur, ok) or woke
        if bad:
            todo.extend((tid, "dead") for tid in await _kill(db, cur, bad))
    if woke:
        await db.notify(cur)


async def _one_fewer(db: Database, cur: Cursor, ok: list[str]) -> bool:
    """The waiting dependants of *ok* (which succeeded) have one dependency fewer left; True
    when one of them became pending."""
    await cur.execute(
        db.sql(
            "WITH gone AS ("
            "  DELETE FROM {s}.task_deps WHERE dep_id = ANY(%(ids)s) RETURNING task_id"
            "), n AS (SELECT task_id, count(*) AS n FROM gone GROUP BY task_id)"
            " UPDATE {s}.tasks t SET deps_left = t.deps_left - n.n,"
            "  state = CASE WHEN t.deps_left <= n.n THEN 'pending' ELSE t.state END,"
            "  run_at = CASE WHEN t.deps_left <= n.n THEN greatest(t.run_at, {now})"
            "   ELSE t.run_at END,"
            "  updated_at = CASE WHEN t.deps_left <= n.n THEN {now}"
            "   ELSE t.updated_at END"
            " FROM n WHERE t.id = n.task_id AND t.state = 'waiting'"
            " RETURNING t.state"
        ),
        db.params(ids=ok),
    )
    return any(r[0] == "pending" for r in await cur.fetchall())


async def _kill(db: Database, cur: Cursor, bad: dict[str, str]) -> list[str]:
    """The waiting dependants of *bad* ({task: how it ended}) die; returns those that did."""
    await cur.execute(
        db.sql("DELETE FROM {s}.task_deps WHERE dep_id = ANY(%(ids)s) RETURNING dep_id, task_id"),
        db.params(ids=sorted(bad)),
    )
    cause: dict[str, str] = {}
    for dep, tid in sorted(await cur.fetchall()):
        cause.setdefault(tid, dep)
    if not cause:
        return []
    tids = sorted(cause)
    details = [f"dependency {cause[t]} ended {bad[cause[t]]}" for t in tids]
    await cur.execute(
        db.sql(
            "WITH dead AS ("
            "  UPDATE {s}.tasks t SET state = 'dead', updated_at = {now},"
            "   error = jsonb_build_object('type', 'DependencyFailed',"
            "    'message', i.detail)::text"
            "  FROM unnest(%(ids)s::text[], %(details)s::text[]) AS i(id, detail)"
            "  WHERE t.id = i.id AND t.state = 'waiting'"
            "  RETURNING t.id, t.fence, i.detail"
            "), events AS ("
            "  INSERT INTO {s}.task_events (task_id, at, event, fence, detail)"
            "  SELECT id, {now}, 'dead', fence, detail FROM dead"
            ") SELECT id FROM dead"
        ),
        db.params(ids=tids, details=details),
    )
    return [r[0] for r in await cur.fetchall()]
