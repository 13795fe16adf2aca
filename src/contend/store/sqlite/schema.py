"""The SQLite store's tables and indexes, and opening a file: create the schema or check it."""

from __future__ import annotations

import sqlite3

from contend.domain.task import FIRST_STEP
from contend.errors import SchemaError
from contend.store.sqlite.connection import is_busy, not_yet

SCHEMA_VERSION = 6
APPLICATION_ID = 0x636E7464  # "cntd", stamped in the file header

SCHEMA = """
CREATE TABLE contend_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    type TEXT NOT NULL,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    priority INTEGER NOT NULL,
    args TEXT NOT NULL,
    kwargs TEXT NOT NULL,
    key TEXT UNIQUE,
    requirements TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_deadline REAL,
    run_at REAL NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    timeout REAL,
    result TEXT,
    error TEXT,
    checkpoint TEXT,
    depends_on TEXT,
    deps_left INTEGER NOT NULL DEFAULT 0,
    eff_priority INTEGER NOT NULL,
    promote_at REAL NOT NULL,
    progress TEXT,
    trace TEXT,
    limit_key TEXT,
    limit_max INTEGER,
    if_failed TEXT,
    rate_interval REAL,
    rate_burst INTEGER,
    fair_key TEXT,
    central INTEGER NOT NULL DEFAULT 0,
    assignee TEXT
);
CREATE INDEX tasks_claimable ON tasks (queue, eff_priority DESC, run_at, id)
    WHERE state = 'pending' AND central = 0;
CREATE INDEX tasks_oldest ON tasks (queue, run_at, id) WHERE state = 'pending';
CREATE INDEX tasks_lane ON tasks (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND central = 0;
CREATE INDEX tasks_central ON tasks (queue, assignee, eff_priority DESC, run_at, id)
    WHERE state = 'pending' AND central = 1;
CREATE INDEX tasks_limited ON tasks (limit_key)
    WHERE limit_key IS NOT NULL AND state IN ('claimed', 'running');
CREATE INDEX tasks_fair ON tasks (queue, fair_key, eff_priority DESC, run_at, id)
    WHERE state = 'pending' AND fair_key IS NOT NULL;
CREATE INDEX tasks_ageing ON tasks (promote_at) WHERE state = 'pending';
CREATE INDEX tasks_owned ON tasks (owner) WHERE state IN ('claimed', 'running');
CREATE INDEX tasks_lease ON tasks (lease_deadline) WHERE state IN ('claimed', 'running');
CREATE INDEX tasks_state ON tasks (state, queue);
CREATE INDEX tasks_done ON tasks (updated_at) WHERE state = 'succeeded';
CREATE TABLE task_deps (dep_id TEXT NOT NULL, task_id TEXT NOT NULL, PRIMARY KEY (dep_id, task_id))
    WITHOUT ROWID;
CREATE TABLE task_events (
    task_id TEXT NOT NULL, at REAL NOT NULL, event TEXT NOT NULL, fence INTEGER NOT NULL,
    expert TEXT, detail TEXT
);
CREATE INDEX task_events_task ON task_events (task_id);
CREATE TABLE auctions (
    task_id TEXT PRIMARY KEY, closes_at REAL NOT NULL, grace REAL NOT NULL DEFAULT 0.5
) WITHOUT ROWID;
CREATE TABLE bids (
    task_id TEXT NOT NULL, expert TEXT NOT NULL, score REAL NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (task_id, expert)
) WITHOUT ROWID;
CREATE TABLE rate_keys (
    key TEXT PRIMARY KEY, interval REAL NOT NULL, burst INTEGER NOT NULL, tat REAL,
    full_until REAL
) WITHOUT ROWID;
CREATE INDEX rate_keys_full ON rate_keys (full_until) WHERE full_until IS NOT NULL;
CREATE TABLE experts (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    info TEXT NOT NULL,
    lease_deadline REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    started_at REAL NOT NULL,
    load INTEGER NOT NULL DEFAULT 0,
    claim_attempts INTEGER NOT NULL DEFAULT 0,
    claims_won INTEGER NOT NULL DEFAULT 0,
    tasks_done INTEGER NOT NULL DEFAULT 0,
    metrics TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE leaders (
    name TEXT PRIMARY KEY, holder TEXT, session TEXT, term INTEGER NOT NULL,
    deadline REAL NOT NULL
) WITHOUT ROWID;
"""

TASK_COLUMNS = (
    "id, type, queue, state, priority, args, kwargs, key, requirements, attempts, max_attempts, "
    "fence, owner, lease_deadline, run_at, created_at, updated_at, timeout, result, error, "
    "checkpoint, depends_on, progress, trace, if_failed, limit_key, limit_max, "
    "fair_key IS NOT NULL"
)

#: What each version adds to the one before it (a file of version 1 is upgraded on open).
UPGRADES: dict[int, tuple[str, ...]] = {
    2: (
        "ALTER TABLE tasks ADD COLUMN progress TEXT",
        "ALTER TABLE tasks ADD COLUMN trace TEXT",
    ),
    # the low lane's skip scan over base priority levels; the grace each auction keeps; what
    # each dependency edge does when its dependency does not succeed (NULL: every edge
    # fails); concurrency limits
    3: (
        "CREATE INDEX IF NOT EXISTS tasks_lane ON tasks (queue, priority DESC, run_at, id) "
        "WHERE state = 'pending'",
        "ALTER TABLE auctions ADD COLUMN grace REAL NOT NULL DEFAULT 0.5",
        "ALTER TABLE tasks ADD COLUMN limit_key TEXT",
        "ALTER TABLE tasks ADD COLUMN limit_max INTEGER",
        "CREATE INDEX IF NOT EXISTS tasks_limited ON tasks (limit_key) "
        "WHERE limit_key IS NOT NULL AND state IN ('claimed', 'running')",
        "ALTER TABLE tasks ADD COLUMN if_failed TEXT",
    ),
    # rate limits (each key's GCRA state in rate_keys) and fair share among limit keys
    4: (
        "ALTER TABLE tasks ADD COLUMN rate_interval REAL",
        "ALTER TABLE tasks ADD COLUMN rate_burst INTEGER",
        "ALTER TABLE tasks ADD COLUMN fair_key TEXT",
        "CREATE INDEX IF NOT EXISTS tasks_fair ON tasks "
        "(queue, fair_key, eff_priority DESC, run_at, id) "
        "WHERE state = 'pending' AND fair_key IS NOT NULL",
        "CREATE TABLE IF NOT EXISTS rate_keys (key TEXT PRIMARY KEY, interval REAL NOT NULL, "
        "burst INTEGER NOT NULL, tat REAL, full_until REAL) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS rate_keys_full ON rate_keys (full_until) "
        "WHERE full_until IS NOT NULL",
    ),
    # central queues: a task's flag and assignee, the leaderships; the claim order's indexes
    # leave central tasks out, so a central backlog costs a compete claim nothing
    5: (
        "ALTER TABLE tasks ADD COLUMN central INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE tasks ADD COLUMN assignee TEXT",
        "DROP INDEX IF EXISTS tasks_claimable",
        "CREATE INDEX tasks_claimable ON tasks (queue, eff_priority DESC, run_at, id) "
        "WHERE state = 'pending' AND central = 0",
        "DROP INDEX IF EXISTS tasks_lane",
        "CREATE INDEX tasks_lane ON tasks (queue, priority DESC, run_at, id) "
        "WHERE state = 'pending' AND central = 0",
        "CREATE INDEX IF NOT EXISTS tasks_central ON tasks "
        "(queue, assignee, eff_priority DESC, run_at, id) WHERE state = 'pending' AND central = 1",
        "CREATE TABLE IF NOT EXISTS leaders (name TEXT PRIMARY KEY, holder TEXT, session TEXT, "
        "term INTEGER NOT NULL, deadline REAL NOT NULL) WITHOUT ROWID",
    ),
    # ageing from the due time rather than the creation (domain.task.AGEING): pending tasks
    # start unaged from it, and the next sweep catches them up; the sweep writes only once a
    # task of a priority other than 0 was submitted (the 'levels' key)
    6: (
        f"UPDATE tasks SET eff_priority = priority, promote_at = run_at + {FIRST_STEP!r} "
        "WHERE state = 'pending'",
        "INSERT OR IGNORE INTO contend_meta SELECT 'levels', '1' "
        "WHERE EXISTS (SELECT 1 FROM tasks WHERE priority <> 0)",
    ),
}


def prepare(db: sqlite3.Connection, path: str, sync: str, *, create: bool = True) -> None:
    """Create the schema in a new file (unless not *create*: a read-only command opening an
    empty file says so and leaves it as it is), or check that an existing one is a contend
    store of this version; then set the journal (WAL) and the *sync* mode."""
    try:
        # One read transaction: another process creating the schema meanwhile must not
        # be seen half way (its application id not yet, its tables already).
        db.execute("BEGIN")
        try:
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            db.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        if is_busy(exc):
            raise
        raise SchemaError(f"{path!r} is not an SQLite database ({exc})") from exc
    if not tables and app_id == 0 and not create:
        raise SchemaError(not_yet(path))
    if not tables and app_id == 0:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        db.execute(stmt)
                db.execute(
                    "INSERT INTO contend_meta VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    elif app_id != APPLICATION_ID or "contend_meta" not in tables:
        raise SchemaError(
            f"{path!r} is an SQLite database but not a contend store "
            "(it has other tables); point --store at a new or existing contend file"
        )
    else:
        version = _version(db)
        if 0 < version < SCHEMA_VERSION:
            version = _upgrade(db)
        if version != SCHEMA_VERSION:
            raise SchemaError(
                f"{path!r} has contend schema version {version}; this contend "
                f"understands version {SCHEMA_VERSION}"
            )
    if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {sync}")


def _version(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM contend_meta WHERE key='schema_version'").fetchone()
    return int(row[0]) if row else 0


def _upgrade(db: sqlite3.Connection) -> int:
    """Bring a file of an older version up to this one, in one write transaction (another
    process may be doing the same: the version is read again under the lock)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        version = _version(db)
        while version in range(1, SCHEMA_VERSION):
            version += 1
            for stmt in UPGRADES[version]:
                db.execute(stmt)
        db.execute(
            "UPDATE contend_meta SET value = ? WHERE key = 'schema_version'", (str(version),)
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return version
