"""The idle-latency probe of ``benchmarks.versions``, the same for every version measured.

Each version's own ``contend bench`` measured latency its own way: older ones from the task's
``created_at`` (stamped inside the store, after the submit call had begun) to its first line,
newer ones from just before the submit call. A ratio between two such versions says more about
the probes than about the code. This module is the one probe both versions run: its experts
run the ``stamp`` task below (``benchmarks.versions_probe:app``, on the path because the
children run from the repository's root), which sends its start time over UDP, and
:func:`latency` times from just before the submit call to that start, as the peers'
benchmarks do. It uses only the public ``App`` API that every version measured has."""

from __future__ import annotations

import asyncio
import random
import socket
import statistics
import time
from typing import Any

from contend import App

app = App()
APP = "benchmarks.versions_probe:app"


@app.task
async def stamp(key: int, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(f"{key} {time.time():.6f}".encode(), ("127.0.0.1", port))


class _Stamps(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: dict[int, float] = {}
        self.arrived = asyncio.Event()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        key, _, when = data.decode().partition(" ")
        self.got[int(key)] = float(when)
        self.arrived.set()

    async def wait(self, key: int, procs: list[Any], within: float = 30.0) -> float:
        deadline = time.monotonic() + within
        while key not in self.got:
            if any(p.returncode is not None for p in procs):
                raise RuntimeError("a probe expert exited (see its output above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"probe task {key} did not start within {within:g}s")
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), 1.0)
            except TimeoutError:
                pass
        return self.got.pop(key)


async def latency(bench: Any, count: int = 300, warm_up: int = 20) -> tuple[float, float]:
    """p50 and p99 in ms of submit-to-start over *count* tasks, one at a time, on one idle
    expert of concurrency 8 started by *bench* (the version's ``Bench``) on a fresh store."""
    import contend.cli.bench as cb

    url, store = await bench.fresh()
    # the version's Bench starts its experts on cb.APP (older ones) or bench.app (newer ones)
    saved = cb.APP
    cb.APP, bench.app = APP, APP
    try:
        procs = await bench.experts(url, 1, concurrency=8)
    finally:
        cb.APP = saved
        bench.app = saved
    samples: list[float] = []
    loop = asyncio.get_running_loop()
    transport, stamps = await loop.create_datagram_endpoint(_Stamps, local_addr=("127.0.0.1", 0))
    port = transport.get_extra_info("sockname")[1]
    try:
        await bench.wait_live(store, 1, procs)
        for n in range(warm_up + count):
            await asyncio.sleep(random.uniform(0.0, 0.01))  # anywhere in the wait cycle
            sent = time.time()
            await store.submit([app.build_spec(stamp, [n, port])])
            started = await stamps.wait(n, procs)
            if n >= warm_up:
                samples.append((started - sent) * 1000)
    finally:
        transport.close()
        await bench.stop(procs)
        await store.close()
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]
