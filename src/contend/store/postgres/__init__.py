"""The PostgreSQL store: experts on many hosts share one database."""

from contend.store.postgres.store import SCHEMA_VERSION, PostgresStore, parse_postgres_url

__all__ = ["SCHEMA_VERSION", "PostgresStore", "parse_postgres_url"]
