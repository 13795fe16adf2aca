"""Wake-ups: writes that make work claimable ``NOTIFY`` the schema's channel; one dedicated
connection ``LISTEN``s to it. If that connection drops it reconnects with back-off, and
meanwhile :meth:`Wakeups.wait_for_change` returns after a short poll interval.

The connection is opened with the store (a bad address fails the open) but listens only from
the first wait or expert registration: a process that only submits, such as a web
application, would otherwise receive a notification for every task it submits (a sixth of
the client's CPU per one-task submit, spent while the submit's own answer is on its way)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

import psycopg
import psycopg.conninfo
from psycopg import AsyncConnection
from psycopg.rows import TupleRow

from contend.errors import StoreError
from contend.store._cancel import cancels, check_wanted
from contend.store._changes import Changes
from contend.store.postgres.database import ENDED, LOWERED, Database
from contend.store.postgres.url import parse_postgres_url, safe

log = logging.getLogger("contend.store.postgres")


class Wakeups:
    """The LISTEN connection and the change counter that :meth:`wait_for_change` watches."""

    def __init__(self, db: Database, *, listen_url: str | None, poll_interval: float) -> None:
        self._db = db
        self._listen_url = listen_url
        self._poll_interval = poll_interval
        self._listener: asyncio.Task[None] | None = None
        self._listening = False
        self._closing = False
        self._listener_conn: AsyncConnection[TupleRow] | None = None
        #: opened by start(), not yet listening: the first wait or registration makes it listen
        self._unused_conn: AsyncConnection[TupleRow] | None = None
        #: wait_for_work watches its notices of work: all but ENDED
        self._changes = Changes()
        self._touch = self._changes.touch

    @property
    def listening(self) -> bool:
        return self._listening

    def opening(self) -> None:
        self._closing = False

    async def _connect(self) -> AsyncConnection[TupleRow]:
        dsn = self._listen_url or self._db.dsn
        if self._listen_url:
            dsn, _ = parse_postgres_url(self._listen_url)
        kwargs = self._db.connect_kwargs(dsn)
        name = psycopg.conninfo.conninfo_to_dict(dsn).get("application_name") or "contend"
        kwargs["application_name"] = f"{name}-listen"
        return await AsyncConnection.connect(dsn, **kwargs)

    async def _listen_connect(self) -> AsyncConnection[TupleRow]:
        conn = await self._connect()
        try:
            await conn.execute(f'LISTEN "{self._db.channel}"')
        except BaseException:
            await conn.close()
            raise
        return conn

    async def start(self) -> None:
        """Open the listen connection; it listens from the first :meth:`listen`."""
        try:
            conn = await asyncio.wait_for(self._connect(), self._db.retry_deadline)
        except (psycopg.Error, TimeoutError) as exc:
            raise StoreError(
                f"cannot LISTEN on PostgreSQL at {safe(self._listen_url or self._db.dsn)}: "
                f"{exc}; add ?listen=off to the store URL to poll instead"
            ) from exc
        self._unused_conn = conn

    async def listen(self) -> None:
        """Listen from now on on the connection start() opened, and count a change: what was
        written before went unheard (a waiter reads the store again, then waits). Nothing to
        do when listening already, or when LISTEN is off."""
        conn, self._unused_conn = self._unused_conn, None
        if conn is None:
            return
        try:
            await conn.execute(f'LISTEN "{self._db.channel}"')
        except psycopg.Error as exc:  # the loop connects again, polling meanwhile
            log.warning("LISTEN failed (%s); polling until it works", exc)
            with contextlib.suppress(psycopg.Error):
                await conn.close()
            listening = None
        else:
            if self._closing:  # closed meanwhile
                await conn.close()
                return
            self._listener_conn = listening = conn
            self._listening = True
            self._db.floors_heard = True
        self._listener = asyncio.get_running_loop().create_task(
            self._listen_loop(listening), name=f"contend-listen-{self._db.schema}"
        )
        self._touch()

    async def stop(self) -> None:
        self._closing = True
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.wait([self._listener], timeout=self._db.retry_deadline)
            self._listener = None
        for conn in (self._listener_conn, self._unused_conn):
            if conn is not None:
                await conn.close()
        self._listener_conn = self._unused_conn = None
        self._listening = False
        self._db.floors_heard = False
        self._db.floors_lowered()  # a notice may have been missed

    async def _listen_loop(self, conn: AsyncConnection[TupleRow] | None) -> None:
        """Turn notifications into wake-ups; on a lost connection, poll and reconnect.

        It stops when ``_closing`` is set, or when cancelled: psycopg may turn a cancellation
        that lands inside a connection attempt into an OperationalError, so the request is
        also read from the task (``store._cancel``), or a store nobody closed would keep its
        event loop from ever closing while the database is gone."""
        pause = 0.05
        since = cancels()
        while not self._closing:
            check_wanted(since)
            if conn is None:
                try:
                    conn = await asyncio.wait_for(self._listen_connect(), self._db.retry_deadline)
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    if self._closing:
                        return
                    log.warning("LISTEN connection failed (%s); retrying in %.2fs", exc, pause)
                    await asyncio.sleep(random.uniform(pause / 2, pause))
                    pause = min(pause * 2, 2.0)
                    continue
                if self._closing:
                    await conn.close()
                    return
                self._listener_conn = conn
                self._listening = True
                self._db.floors_heard = True
                self._touch()  # changes may have been missed while it was down
                log.info("LISTEN connection restored")
            pause = 0.05
            try:
                async for notice in conn.notifies():
                    if notice.payload == LOWERED:
                        self._db.floors_lowered()
                    self._touch(work=notice.payload != ENDED)
            except psycopg.Error as exc:
                if not self._closing:
                    log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            self._listening = False
            self._db.floors_heard = False
            self._db.floors_lowered()  # a notice may have been missed
            self._listener_conn = None
            try:
                await conn.close()
            except psycopg.Error:
                pass
            conn = None
            self._touch()

    async def wait_for_change(self, timeout: float) -> None:
        """Return on a notification (or a missed one), else after *timeout* seconds; while the
        LISTEN connection is down (or disabled), after at most the poll interval."""
        await self.listen()
        await self._changes.wait(self._bound(timeout))

    async def wait_for_work(self, timeout: float) -> None:
        """As :meth:`wait_for_change`, but not woken by tasks that ended and freed nothing."""
        await self.listen()
        await self._changes.wait(self._bound(timeout), work=True)

    def _bound(self, timeout: float) -> float:
        """While not listening, a waiter polls: it returns after the poll interval at most."""
        return timeout if self._listening else min(timeout, self._poll_interval)
