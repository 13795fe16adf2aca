"""A fresh PostgreSQL database per test, for suites that run against a real server.

``CONTEND_TEST_PG`` names the server (a URL without a database, default
``postgresql://postgres@127.0.0.1:5432``); the user must be allowed to create databases.
Needs the ``postgres`` extra.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432"


def server_url() -> str:
    return os.environ.get("CONTEND_TEST_PG", DEFAULT_SERVER).rstrip("/")


class NoServer(Exception):
    """The test server cannot be reached; the message says where it was looked for."""


@asynccontextmanager
async def fresh_database(server: str | None = None) -> AsyncIterator[str]:
    """Create ``contend_test_<random>`` on *server*, yield its URL, drop it afterwards (with
    any connection still open to it). Raises :class:`NoServer` when the server is down."""
    server = server or server_url()
    try:
        admin = await psycopg.AsyncConnection.connect(
            f"{server}/postgres", autocommit=True, connect_timeout=5
        )
    except psycopg.OperationalError as exc:
        raise NoServer(f"no PostgreSQL at {server} (set CONTEND_TEST_PG): {exc}") from exc
    name = f"contend_test_{uuid.uuid4().hex[:12]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"{server}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
