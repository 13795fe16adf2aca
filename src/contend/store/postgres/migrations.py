"""Versioned schema migrations for the PostgreSQL store.

Each step is a list of SQL statements; ``{s}`` stands for the quoted schema name. A step, once
released, is never edited: a change to the schema is a new step appended to :data:`MIGRATIONS`.
The ``contend_schema_version`` table records every applied step, so ``max(version)`` is the
schema's version.
"""

from __future__ import annotations

from dataclasses import dataclass

from contend.domain.task import FIRST_STEP


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


_STATES = "'pending','waiting','claimed','running','succeeded','failed','dead','cancelled'"

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "tasks, dependencies, history and experts",
        (
            f"""
            CREATE TABLE {{s}}.tasks (
                id text PRIMARY KEY,
                type text NOT NULL,
                queue text NOT NULL,
                state text NOT NULL CHECK (state IN ({_STATES})),
                priority integer NOT NULL,
                args text NOT NULL,
                kwargs text NOT NULL,
                key text UNIQUE,
                requirements jsonb,
                attempts integer NOT NULL DEFAULT 0,
                max_attempts integer NOT NULL,
                fence bigint NOT NULL DEFAULT 0,
                owner text,
                lease_deadline float8,
                run_at float8 NOT NULL,
                created_at float8 NOT NULL,
                updated_at float8 NOT NULL,
                timeout float8,
                result text,
                error text,
                checkpoint text,
                depends_on text[],
                deps_left integer NOT NULL DEFAULT 0
            )
            """,
            "CREATE INDEX tasks_claimable ON {s}.tasks (queue, priority DESC, run_at, id) "
            "WHERE state = 'pending'",
            "CREATE INDEX tasks_owned ON {s}.tasks (owner) WHERE state IN ('claimed', 'running')",
            "CREATE INDEX tasks_lease ON {s}.tasks (lease_deadline) "
            "WHERE state IN ('claimed', 'running')",
            "CREATE INDEX tasks_state ON {s}.tasks (state, queue)",
            "CREATE INDEX tasks_done ON {s}.tasks (updated_at) WHERE state = 'succeeded'",
            """
            CREATE TABLE {s}.task_deps (
                dep_id text NOT NULL,
                task_id text NOT NULL,
                PRIMARY KEY (dep_id, task_id)
            )
            """,
            """
            CREATE TABLE {s}.task_events (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                task_id text NOT NULL,
                at float8 NOT NULL,
                event text NOT NULL,
                fence bigint NOT NULL,
                expert text,
                detail text
            )
            """,
            "CREATE INDEX task_events_task ON {s}.task_events (task_id, seq)",
            """
            CREATE TABLE {s}.experts (
                id text PRIMARY KEY,
                session text NOT NULL,
                info text NOT NULL,
                lease_deadline float8 NOT NULL,
                heartbeat_at float8 NOT NULL,
                started_at float8 NOT NULL,
                load integer NOT NULL DEFAULT 0,
                claim_attempts bigint NOT NULL DEFAULT 0,
                claims_won bigint NOT NULL DEFAULT 0,
                tasks_done bigint NOT NULL DEFAULT 0
            )
            """,
        ),
    ),
    Migration(
        2,
        "expert metrics, auctions and bids",
        (
            "ALTER TABLE {s}.experts ADD COLUMN metrics text NOT NULL DEFAULT '{}'",
            "CREATE TABLE {s}.auctions (task_id text PRIMARY KEY, closes_at float8 NOT NULL)",
            """
            CREATE TABLE {s}.bids (
                task_id text NOT NULL,
                expert text NOT NULL,
                score float8 NOT NULL,
                at float8 NOT NULL,
                PRIMARY KEY (task_id, expert)
            )
            """,
        ),
    ),
    Migration(
        3,
        "effective priority that grows as a task waits, and the low-priority lane",
        (
            "ALTER TABLE {s}.tasks ADD COLUMN eff_priority integer, ADD COLUMN promote_at float8",
            # due at once: the next expire() computes both from each task's age
            "UPDATE {s}.tasks SET eff_priority = priority, promote_at = created_at",
            "ALTER TABLE {s}.tasks ALTER COLUMN eff_priority SET NOT NULL, "
            "ALTER COLUMN promote_at SET NOT NULL",
            "DROP INDEX {s}.tasks_claimable",
            "CREATE INDEX tasks_claimable ON {s}.tasks (queue, eff_priority DESC, run_at, id) "
            "WHERE state = 'pending'",
            "CREATE INDEX tasks_oldest ON {s}.tasks (queue, run_at, id) WHERE state = 'pending'",
            "CREATE INDEX tasks_ageing ON {s}.tasks (promote_at) WHERE state = 'pending'",
        ),
    ),
    Migration(
        4,
        "claims walk the claim-order index: drop the (state, queue) index that lured the planner",
        (
            # A task table churns faster than its statistics: right after a large submit the
            # planner believes few tasks are pending, picks this index for claims and then
            # sorts every pending task (20 ms at 20,000). Without it, claims walk
            # tasks_claimable in order and stop at LIMIT (under 2 ms).
            "DROP INDEX IF EXISTS {s}.tasks_state",
        ),
    ),
    Migration(
        5,
        "a task's progress (ctx.progress) and the submitter's trace context",
        ("ALTER TABLE {s}.tasks ADD COLUMN progress text, ADD COLUMN trace text",),
    ),
    Migration(
        6,
        "the low-priority lane finds each base priority level by a skip scan",
        (
            # One probe per level (priority < the last, first in this order) and then each
            # level's oldest by (run_at, id): the lane never walks a flood at another level.
            "CREATE INDEX tasks_lane ON {s}.tasks (queue, priority DESC, run_at, id) "
            "WHERE state = 'pending'",
        ),
    ),
    Migration(
        7,
        "each auction keeps the grace its first bid set: claims keep the auction's order",
        (
            # An auction open during the upgrade gets the experts' default grace (0.5 s, the
            # value they used then); every later one is given its own by its first bid.
            "ALTER TABLE {s}.auctions ADD COLUMN grace float8 NOT NULL DEFAULT 0.5",
            "ALTER TABLE {s}.auctions ALTER COLUMN grace DROP DEFAULT",
        ),
    ),
    Migration(
        8,
        "what each dependency edge does when its dependency does not succeed",
        # aligned with depends_on; NULL: every edge fails, as every edge did before
        ("ALTER TABLE {s}.tasks ADD COLUMN if_failed text[]",),
    ),
    Migration(
        9,
        "concurrency limits: a task's limit key and limit, and an index of each key's holders",
        (
            # NULL: no limit, as every task had before
            "ALTER TABLE {s}.tasks ADD COLUMN limit_key text, ADD COLUMN limit_max integer",
            # the claimed and running tasks of a key, counted by every claim that meets it
            "CREATE INDEX tasks_limited ON {s}.tasks (limit_key) "
            "WHERE limit_key IS NOT NULL AND state IN ('claimed', 'running')",
        ),
    ),
    Migration(
        10,
        "rate limits (each key's GCRA state in rate_keys) and fair share among limit keys",
        (
            # NULL: no rate, not fair, as every task had before
            "ALTER TABLE {s}.tasks ADD COLUMN rate_interval float8, ADD COLUMN rate_burst integer,"
            " ADD COLUMN fair_key text",
            # a key's rate is its latest submission's; tat: when its next start is due (NULL:
            # never started); full_until = tat - (burst - 1) * interval, so that the keys with
            # no room now are one range of rate_keys_full, however many keys there are
            """
            CREATE TABLE {s}.rate_keys (
                key text PRIMARY KEY,
                interval float8 NOT NULL,
                burst integer NOT NULL,
                tat float8,
                full_until float8
            )
            """,
            "CREATE INDEX rate_keys_full ON {s}.rate_keys (full_until) "
            "WHERE full_until IS NOT NULL",
            # the fair claim's skip scan over a queue's fair keys, and each key's heads
            "CREATE INDEX tasks_fair ON {s}.tasks (queue, fair_key, eff_priority DESC, run_at, id)"
            " WHERE state = 'pending' AND fair_key IS NOT NULL",
        ),
    ),
    Migration(
        11,
        "central queues: a task's flag and assignee, the leaderships; claim order leaves them out",
        (
            # false: a compete or fifo task, as every task was before
            "ALTER TABLE {s}.tasks ADD COLUMN central boolean NOT NULL DEFAULT false,"
            " ADD COLUMN assignee text",
            # the claim order's indexes without central tasks, so that a central backlog costs
            # a compete claim nothing; each built before the old one goes, then given its name
            "CREATE INDEX tasks_claimable_11 ON {s}.tasks (queue, eff_priority DESC, run_at, id)"
            " WHERE state = 'pending' AND NOT central",
            "DROP INDEX {s}.tasks_claimable",
            "ALTER INDEX {s}.tasks_claimable_11 RENAME TO tasks_claimable",
            "CREATE INDEX tasks_lane_11 ON {s}.tasks (queue, priority DESC, run_at, id)"
            " WHERE state = 'pending' AND NOT central",
            "DROP INDEX {s}.tasks_lane",
            "ALTER INDEX {s}.tasks_lane_11 RENAME TO tasks_lane",
            "CREATE INDEX tasks_fair_11 ON {s}.tasks"
            " (queue, fair_key, eff_priority DESC, run_at, id)"
            " WHERE state = 'pending' AND fair_key IS NOT NULL AND NOT central",
            "DROP INDEX {s}.tasks_fair",
            "ALTER INDEX {s}.tasks_fair_11 RENAME TO tasks_fair",
            # an assignee's claim and the leader's read: a seek on (queue, assignee)
            "CREATE INDEX tasks_central ON {s}.tasks"
            " (queue, assignee, eff_priority DESC, run_at, id)"
            " WHERE state = 'pending' AND central",
            # term: raised by one each time the leadership changes hands; holder NULL: nobody
            """
            CREATE TABLE {s}.leaders (
                name text PRIMARY KEY,
                holder text,
                session text,
                term bigint NOT NULL,
                deadline float8 NOT NULL
            )
            """,
        ),
    ),
    Migration(
        12,
        "features in use: a claim leaves out the parts for those it never met",
        (
            # a row for each feature any task or bid of this store ever used; written in the
            # same statement as the task (submit) or the auction (bid) that first uses it
            "CREATE TABLE {s}.features (name text PRIMARY KEY)",
            "INSERT INTO {s}.features SELECT 'central'"
            " WHERE EXISTS (SELECT 1 FROM {s}.tasks WHERE central)",
            "INSERT INTO {s}.features SELECT 'limits'"
            " WHERE EXISTS (SELECT 1 FROM {s}.tasks WHERE limit_key IS NOT NULL)"
            " OR EXISTS (SELECT 1 FROM {s}.rate_keys)",
            "INSERT INTO {s}.features SELECT 'fair'"
            " WHERE EXISTS (SELECT 1 FROM {s}.tasks WHERE fair_key IS NOT NULL)",
            "INSERT INTO {s}.features SELECT 'auctions'"
            " WHERE EXISTS (SELECT 1 FROM {s}.auctions) OR EXISTS (SELECT 1 FROM {s}.bids)",
        ),
    ),
    Migration(
        13,
        "priority levels in use: a low lane looks for levels only where there are some",
        (
            # 'levels' in features: a task of a priority other than 0 was submitted; the lean
            # claim leaves out the other features' parts, not the low lane
            "INSERT INTO {s}.features SELECT 'levels'"
            " WHERE EXISTS (SELECT 1 FROM {s}.tasks WHERE priority <> 0)",
        ),
    ),
    Migration(
        14,
        "the pending tasks' other indexes out of the claim's reach: its walks take claim order",
        (
            # A query may use any index whose predicate its conditions imply. With statistics
            # that say few tasks are pending, a claim's generic plan read the smallest such
            # index, tasks_ageing, and sorted: behind a transaction that held vacuum back it
            # fetched the entry of every task done since, past any floor (18,503 buffers and
            # 55 ms a claim). Each of these indexes now also requires a condition true of
            # every row (the columns are NOT NULL) that only its own queries state or imply:
            # claims can walk tasks_claimable alone, and next_due, backlog, stats and the
            # lane's skip scan (NOT_CLAIMED in ``rows``) cannot take tasks_ageing.
            *(
                step
                for name, columns, only in (
                    ("tasks_oldest", "(queue, run_at, id)", "created_at IS NOT NULL"),
                    ("tasks_ageing", "(promote_at)", "promote_at IS NOT NULL"),
                    (
                        "tasks_lane",
                        "(queue, priority DESC, run_at, id)",
                        "created_at IS NOT NULL AND NOT central",
                    ),
                )
                for step in (
                    f"CREATE INDEX {name}_14 ON {{s}}.tasks {columns}"
                    f" WHERE state = 'pending' AND {only}",
                    f"DROP INDEX {{s}}.{name}",
                    f"ALTER INDEX {{s}}.{name}_14 RENAME TO {name}",
                )
            ),
        ),
    ),
    Migration(
        15,
        "ageing from the due time: pending tasks start unaged from it",
        (
            # domain.task.AGEING: a task's age is reckoned from run_at, not created_at; the
            # next sweep catches each pending task up from it, and a store without 'levels'
            # (no priority other than 0) writes no ageing at all
            "UPDATE {s}.tasks SET eff_priority = priority,"
            f" promote_at = run_at + {FIRST_STEP!r} WHERE state = 'pending'",
        ),
    ),
)

#: The version this contend understands.
SCHEMA_VERSION = MIGRATIONS[-1].version

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS {s}.contend_schema_version (
    version integer PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
