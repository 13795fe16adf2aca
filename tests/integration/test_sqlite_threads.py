"""SQLite under real contention: several threads, each with its own connection and event loop,
claim and commit from one file at once, so the busy-retry path and BEGIN IMMEDIATE really race
(the contract suite's concurrent test runs its instances on one event loop, one at a time)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from contend.domain.task import Capabilities, TaskSpec, TaskState
from contend.store.port import Completion, ExpertInfo
from contend.store.registry import open_store


async def _work(url: str, name: str, out: list[tuple[str, str, int]]) -> None:
    store = await open_store(url)
    try:
        session = await store.register_expert(ExpertInfo(id=name), 60)
        while True:
            got = await store.claim(
                name, session, ["default"], Capabilities(), limit=1, lease_ttl=60
            )
            if not got:
                return
            done = await store.complete(
                name, [Completion(c.id, c.fence, json.dumps(name)) for c in got]
            )
            assert done == [None] * len(got)
            out.extend((c.id, name, c.fence) for c in got)
    finally:
        await store.close()


def test_threads_on_one_file_never_share_a_task(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    specs = [TaskSpec.build("job", [n]) for n in range(600)]

    async def setup() -> None:
        store = await open_store(url)
        await store.submit(specs)
        await store.close()

    asyncio.run(setup())
    results: list[list[tuple[str, str, int]]] = [[] for _ in range(6)]
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            asyncio.run(_work(url, f"t{n}", results[n]))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    claimed = [tid for r in results for tid, _, _ in r]
    assert sorted(claimed) == sorted(s.id for s in specs)
    assert sum(1 for r in results if r) >= 2, "the threads did not overlap at all"

    async def check() -> None:
        store = await open_store(url)
        by_id = {tid: name for r in results for tid, name, _ in r}
        for task in await store.list_tasks(limit=1000):
            assert (task.state, task.fence, task.attempts) == (TaskState.SUCCEEDED, 1, 1)
            assert task.result == by_id[task.id]
        await store.close()

    asyncio.run(check())
