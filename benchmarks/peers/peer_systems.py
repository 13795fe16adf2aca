"""The peers, each at its defaults, behind one small interface; runs in the bench virtualenv.

Every peer has two task types: ``noop`` (does nothing) and ``stamp(key)`` (sends ``key`` and
the time it started to the benchmark's UDP receiver). PgQueuer and Procrastinate run them as
coroutine functions, Huey as plain functions (it has no other kind).

Setups (docs/benchmarks.md repeats them):

* **PgQueuer**: asyncpg driver, two worker processes, each a ``QueueManager`` run with its
  defaults (``batch_size=10``, LISTEN/NOTIFY, no concurrency limit); bulk enqueue is one
  ``Queries.enqueue`` call with lists.
* **Procrastinate**: psycopg connector, two worker processes, each ``run_worker_async()`` with
  its defaults (concurrency 1, LISTEN/NOTIFY, 5 s polling fallback); bulk enqueue is
  ``batch_defer_async``.
* **Huey** on SQLite (``SqliteHuey``, its defaults: WAL, no fsync) and on Redis (``RedisHuey``,
  blocking pops): one consumer with two worker processes (``-w 2 -k process``, to match
  contend's two expert processes; the rest at its defaults: 0.1 s initial poll delay backing
  off to 10 s when idle on SQLite). Huey has no bulk enqueue: ``noop.map()`` enqueues one by one.

``python -m benchmarks.peers.peer_worker PEER TARGET`` is one worker process (or, for Huey,
the consumer): it connects, prints ``ready``, waits for a line on stdin, then works until
SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from benchmarks.peers.common import REDIS_URL, pg_backend_pids, redis_server_pid, send_stamp

PEERS = ("pgqueuer", "procrastinate", "huey-sqlite", "huey-redis")
BACKEND = {
    "pgqueuer": "postgresql",
    "procrastinate": "postgresql",
    "huey-sqlite": "sqlite",
    "huey-redis": "redis",
}


# -- PgQueuer --------------------------------------------------------------------------------
class PgQueuer:
    processes = 2  # worker processes started

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: Any = None
        self.queries: Any = None

    async def open(self) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        self.conn = await asyncpg.connect(self.dsn)
        self.queries = Queries(AsyncpgDriver(self.conn))

    async def setup(self) -> None:
        await self.queries.install()

    async def close(self) -> None:
        await self.conn.close()

    async def submit_one(self, key: str) -> None:
        await self.queries.enqueue("stamp", key.encode())

    async def submit_many(self, keys: list[str]) -> None:
        await self.queries.enqueue(
            ["stamp"] * len(keys), [k.encode() for k in keys], [0] * len(keys)
        )

    async def submit_noops(self, n: int) -> None:
        await self.queries.enqueue(["noop"] * n, [None] * n, [0] * n)

    async def remaining(self) -> int:
        # done jobs leave the queue table for the log table
        return int(await self.conn.fetchval("SELECT count(*) FROM pgqueuer"))

    async def server_pids(self) -> list[int]:
        mine = await self.conn.fetchval("SELECT pg_backend_pid()")
        return pg_backend_pids(self.dsn, exclude=[mine])

    @staticmethod
    async def work(dsn: str, go: Any) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries, QueueManager

        conn = await asyncpg.connect(dsn)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            return None

        @qm.entrypoint("stamp")
        async def stamp(job: Any) -> None:
            send_stamp(job.payload.decode())

        await go()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        await qm.run()
        await conn.close()


# -- Procrastinate ---------------------------------------------------------------------------
def _procrastinate_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    @app.task(name="stamp")
    async def stamp(key: str) -> None:
        send_stamp(key)

    return app


class Procrastinate:
    processes = 2

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.app = _procrastinate_app(dsn)
        self.conn: Any = None

    async def open(self) -> None:
        import psycopg

        await self.app.open_async()
        self.conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)

    async def setup(self) -> None:
        await self.app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        await self.conn.close()
        await self.app.close_async()

    async def submit_one(self, key: str) -> None:
        await self.app.tasks["stamp"].defer_async(key=key)

    async def submit_many(self, keys: list[str]) -> None:
        await self.app.tasks["stamp"].batch_defer_async(*({"key": k} for k in keys))

    async def submit_noops(self, n: int) -> None:
        await self.app.tasks["noop"].batch_defer_async(*({} for _ in range(n)))

    async def remaining(self) -> int:
        cur = await self.conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )
        row = await cur.fetchone()
        return int(row[0])

    async def server_pids(self) -> list[int]:
        cur = await self.conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        # the app's own pool (the submitting side) is idle while a drain runs
        return pg_backend_pids(self.dsn, exclude=[row[0]])

    @staticmethod
    async def work(dsn: str, go: Any) -> None:
        app = _procrastinate_app(dsn)
        async with app.open_async():
            await go()
            await app.run_worker_async()  # its defaults; stops on SIGTERM


# -- Huey --------------------------------------------------------------------------------------
def _huey(target: str) -> Any:
    """*target*: an SQLite file path, or ``redis:NAME``."""
    import huey

    if target.startswith("redis:"):
        h = huey.RedisHuey(name=target.removeprefix("redis:"), url=REDIS_URL)
    else:
        h = huey.SqliteHuey(name="bench", filename=target)

    @h.task(name="noop")
    def noop() -> None:
        return None

    @h.task(name="stamp")
    def stamp(key: str) -> None:
        send_stamp(key)

    h.bench_tasks = {"noop": noop, "stamp": stamp}
    return h


class Huey:
    processes = 1  # one consumer, which starts two worker processes

    def __init__(self, target: str) -> None:
        self.target = target
        self.huey = _huey(target)
        self.tasks = self.huey.bench_tasks

    async def open(self) -> None:
        return None

    async def setup(self) -> None:
        return None

    async def close(self) -> None:
        if self.target.startswith("redis:"):
            self.huey.flush()  # its own keys only

    async def submit_one(self, key: str) -> None:
        self.tasks["stamp"](key)

    async def submit_many(self, keys: list[str]) -> None:
        self.tasks["stamp"].map((k,) for k in keys)

    async def submit_noops(self, n: int) -> None:
        self.tasks["noop"].map(() for _ in range(n))

    async def remaining(self) -> int:
        # the queue only: at most two no-op tasks are still in the workers' hands
        return int(self.huey.pending_count())

    async def server_pids(self) -> list[int]:
        if self.target.startswith("redis:"):
            pid = redis_server_pid()
            return [pid] if pid else []
        return []

    @staticmethod
    def work_sync(target: str) -> None:
        h = _huey(target)
        consumer = h.create_consumer(workers=2, worker_type="process")
        print("ready", flush=True)
        sys.stdin.readline()
        consumer.run()  # SIGTERM stops it


def make(peer: str, target: str) -> Any:
    if peer == "pgqueuer":
        return PgQueuer(target)
    if peer == "procrastinate":
        return Procrastinate(target)
    if peer in ("huey-sqlite", "huey-redis"):
        return Huey(target)
    raise SystemExit(f"unknown peer {peer!r}; one of {', '.join(PEERS)}")


def main() -> int:
    peer, target = sys.argv[1], sys.argv[2]
    if peer.startswith("huey"):
        Huey.work_sync(target)
        return 0

    async def go() -> None:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    cls = PgQueuer if peer == "pgqueuer" else Procrastinate
    asyncio.run(cls.work(target, go))
    return 0
