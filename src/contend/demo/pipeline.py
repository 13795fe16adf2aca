"""The pipeline of ``contend demo --pipeline``: web-server log lines through extract →
transform → load into a SQLite table, each stage its own queue (seed 000 §3.2).

* **extract** takes chunk descriptors ``[seed, lines]``, reads the chunk (generated from its
  seed, as ``contend.demo.tasks`` does) and parses each line into a record;
* **transform** adds the region, the status class and whether the client is a bot;
* **load** inserts the records into the ``requests`` table of the SQLite file named by
  ``CONTEND_PIPELINE_SINK``, one transaction a task, keyed by the record's place so that a
  repeated run writes nothing twice.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from contend import App
from contend.demo.tasks import LINE, generate

app = App()

#: Records per task after extract, and the pending tasks a stage's queue may hold.
BATCH = 1000
LIMIT = 40
BOTS = ("curl", "python", "Go-http")
SINK_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS requests (chunk INTEGER, line INTEGER, ip TEXT, method TEXT, "
    "path TEXT, status INTEGER, size INTEGER, region TEXT, class TEXT, bot INTEGER, "
    "PRIMARY KEY (chunk, line)) WITHOUT ROWID"
)


def extract(chunks: list[list[int]]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for seed, lines in chunks:
        for n, line in enumerate(generate(seed, lines)):
            m = LINE.match(line)
            if m is not None:
                out.append(
                    [
                        seed,
                        n,
                        m["ip"],
                        m["method"],
                        m["path"],
                        int(m["status"]),
                        int(m["size"]),
                        m["agent"],
                    ]
                )
    return out


def transform(records: list[list[Any]]) -> list[list[Any]]:
    out = []
    for seed, n, ip, method, path, status, size, agent in records:
        region = ("eu", "us", "apac", "latam")[int(ip.split(".")[1]) % 4]
        bot = int(agent.startswith(BOTS))
        out.append([seed, n, ip, method, path, status, size, region, f"{status // 100}xx", bot])
    return out


def load(records: list[list[Any]]) -> int:
    db = sqlite3.connect(os.environ["CONTEND_PIPELINE_SINK"], timeout=60)
    try:
        with db:
            db.executemany(
                "INSERT OR IGNORE INTO requests VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", records
            )
    finally:
        db.close()
    return len(records)


logs = app.pipeline("weblog", extract, transform, load, batch=BATCH, limit=LIMIT, retries=5)


def open_sink(path: str) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(SINK_SCHEMA)
    db.commit()
    db.close()
