"""The schema's version: create it in an empty database, refuse one of another version, and
apply the missing steps of :data:`~contend.store.postgres.migrations.MIGRATIONS`."""

from __future__ import annotations

import logging

from contend.errors import SchemaError
from contend.store.postgres.database import Cursor, Database, one
from contend.store.postgres.migrations import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE
from contend.store.postgres.url import safe

log = logging.getLogger("contend.store.postgres")

#: Servers already told about: the warning below is said once per process and server.
_WARNED: set[str] = set()


async def schema_version(db: Database, cur: Cursor) -> int | None:
    """The schema's version; None when the schema is absent or empty. Raises SchemaError
    when it holds tables that are not a contend store's."""
    await cur.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
        (db.schema,),
    )
    tables = {r[0] for r in await cur.fetchall()}
    if not tables:
        return None
    if "contend_schema_version" not in tables:
        raise SchemaError(
            f"schema {db.schema!r} of {safe(db.dsn)} holds tables but is not a "
            "contend store; choose another with ?schema=name in the store URL"
        )
    await cur.execute(db.sql("SELECT max(version) FROM {s}.contend_schema_version"))
    version = one(await cur.fetchone())[0]
    return int(version or 0)


async def prepare(db: Database, *, create: bool = True) -> None:
    """Create the schema in an empty database (unless not *create*: SchemaError, nothing
    written); refuse one of another version."""

    async def check(cur: Cursor) -> tuple[int | None, bool]:
        await cur.execute("SELECT current_setting('autovacuum') = 'on'")
        autovacuum = bool(one(await cur.fetchone())[0])
        return await schema_version(db, cur), autovacuum

    version, autovacuum = await db.run(check)
    if not autovacuum and create:
        warn_no_autovacuum(db)
    if version is None and not create:
        raise SchemaError(
            f"schema {db.schema!r} of {safe(db.dsn)} is absent or empty: it is not (yet) a "
            "contend store; contend migrate, submitting a task or starting an expert creates "
            "it (or check --store)"
        )
    if version is None:
        await migrate(db)
        return
    check_version(db, version)


def warn_no_autovacuum(db: Database) -> None:
    """Say once that the server does not vacuum by itself. Every claim and completion leaves a
    dead row version behind; without vacuum they pile up, the tables grow without end however
    short the retention, and the store slows down (a million tasks through one expert: 2,488
    tasks/s and 1,556 MiB growing, against 5,008 tasks/s and 790 MiB levelling off with it on)."""
    where = safe(db.dsn).rsplit("/", 1)[0]  # the server, whatever the database
    if where in _WARNED:
        return
    _WARNED.add(where)
    log.warning(
        "autovacuum is off on PostgreSQL at %s: contend's tables will grow and its claims slow "
        "down as tasks finish; turn it on (ALTER SYSTEM SET autovacuum = on; SELECT "
        "pg_reload_conf()) or VACUUM the %s schema's tables often (docs/postgres.md)",
        where,
        db.schema,
    )


def check_version(db: Database, version: int) -> None:
    if version < SCHEMA_VERSION:
        raise SchemaError(
            f"schema {db.schema!r} of {safe(db.dsn)} is at version {version}; this "
            f"contend needs version {SCHEMA_VERSION}: run contend migrate"
        )
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"schema {db.schema!r} of {safe(db.dsn)} is at version {version}, newer "
            f"than this contend understands ({SCHEMA_VERSION}): upgrade contend"
        )


async def migrate(db: Database) -> list[int]:
    """Apply the missing steps; returns the versions applied. An advisory lock orders
    several processes that run it at once."""

    async def run(cur: Cursor) -> list[int]:
        await cur.execute(
            "SELECT pg_advisory_xact_lock(hashtext('contend.migrate.' || %s))", (db.schema,)
        )
        current = await schema_version(db, cur)
        await cur.execute(db.sql("CREATE SCHEMA IF NOT EXISTS {s}"))
        await cur.execute(db.sql(VERSION_TABLE))
        current = current or 0
        if current > SCHEMA_VERSION:
            check_version(db, current)
        applied = []
        for step in MIGRATIONS:
            if step.version <= current:
                continue
            for statement in step.statements:
                await cur.execute(db.sql(statement))
            await cur.execute(
                db.sql(
                    "INSERT INTO {s}.contend_schema_version (version, description) VALUES (%s, %s)"
                ),
                (step.version, step.description),
            )
            applied.append(step.version)
        return applied

    return await db.run(run)
