"""Kept for old imports: the migrations live in :mod:`contend.store.postgres.migrations`."""

from contend.store.postgres.migrations import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE, Migration

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "VERSION_TABLE", "Migration"]
