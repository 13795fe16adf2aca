"""A TCP fault proxy: put it between a client and a server, then break the path on demand.

``FaultProxy(host, port).start()`` listens on a free loopback port (``proxy.port``) and forwards
every connection to the target. Its faults, each applied to every connection at once:

* :meth:`~FaultProxy.freeze` — a partition without reset: nothing more is forwarded either way,
  nothing is closed; new connections are accepted and go nowhere. Clients see calls that hang.
  :meth:`~FaultProxy.unfreeze` delivers what was held, as TCP retransmission would once the
  network is back;
* :meth:`~FaultProxy.cut` — every connection is reset and the port refuses new ones, as a host
  that went away (until :meth:`~FaultProxy.heal`);
* :meth:`~FaultProxy.reset` — every connection is reset; new ones are welcome at once.

``delay=S`` holds every chunk S seconds in each direction before it is passed on (chunks keep
their order and do not wait for each other): a link with 2 S more round-trip time, for a
client in a far zone where the kernel has no ``netem``.

:meth:`~FaultProxy.heal` ends whatever fault is on. The proxy runs its own event loop in a
thread, so it keeps forwarding (or holding) whatever the caller's loop is doing, and its methods
may be called from sync or async code. ``python -m contend.testing.proxy TARGET_HOST:PORT``
runs one from a shell and takes ``freeze``/``unfreeze``/``cut``/``reset``/``heal`` on stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

PASS, FROZEN, CUT = "pass", "frozen", "cut"
CHUNK = 65536


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    pumps: list[asyncio.Task[None]] = field(default_factory=list)

    def reset(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                _abort(writer)
        for pump in self.pumps:
            pump.cancel()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), not a polite FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Forwards ``host:port`` (default a free loopback port) to ``target_host:target_port``."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay: float = 0.0,
    ) -> None:
        if not 0 <= delay < 60:
            raise ValueError(f"delay must be from 0 to 60 seconds, got {delay!r}")
        self.target = (target_host, target_port)
        self.delay = delay
        self.host = host
        self.port = port
        self.mode = PASS
        self.accepted = 0  # connections accepted so far
        self.forwarded = 0  # bytes forwarded so far, both ways
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing: asyncio.Event | None = None

    # -- life ------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        """Start forwarding (in a thread of its own); returns the proxy."""
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"contend-proxy-{self.target[1]}", daemon=True
        )
        self._thread.start()
        self._run(self._setup())
        return self

    def close(self) -> None:
        """Reset every connection, stop listening and stop the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._run(self._cut())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, url: str) -> str:
        """*url* (``postgresql://user@host:5432/db``, ``etcd://host:2379/prefix``) with its
        host and port replaced by the proxy's."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@" if user else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self.host}:{self.port}"))

    # -- faults ----------------------------------------------------------------------------
    def freeze(self) -> None:
        """Forward nothing more, close nothing: a partition whose packets vanish."""
        self._run(self._set_mode(FROZEN))

    def unfreeze(self) -> None:
        """Deliver what was held and forward again."""
        self._run(self._set_mode(PASS))

    def cut(self) -> None:
        """Reset every connection and refuse new ones until :meth:`heal`."""
        self._run(self._cut())

    def reset(self) -> None:
        """Reset every connection now; new ones are accepted and forwarded."""
        self._run(self._reset())

    def heal(self) -> None:
        """End any fault: listen again after a cut, deliver and forward after a freeze."""
        self._run(self._heal())

    @property
    def connections(self) -> int:
        """Connections open through the proxy right now."""
        return len(self._links)

    # -- inside the proxy's loop -----------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not started (call start())")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _setup(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        await self._listen()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_mode(self, mode: str) -> None:
        assert self._flowing is not None
        self.mode = mode
        if mode == PASS:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _reset(self) -> None:
        for link in list(self._links):
            link.reset()
        self._links.clear()

    async def _cut(self) -> None:
        await self._set_mode(CUT)
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        await self._reset()

    async def _heal(self) -> None:
        if self._server is None:
            await self._listen()
        await self._set_mode(PASS)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self.accepted += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            await self._flowing.wait()  # frozen: the connection is held, silent
            if link not in self._links:
                return  # reset meanwhile
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                _abort(writer)  # the target refused: so does the proxy
                self._links.discard(link)
                return
            link.upstream = up_writer
            loop = asyncio.get_running_loop()
            link.pumps = [
                loop.create_task(self._pump(reader, up_writer)),
                loop.create_task(self._pump(up_reader, writer)),
            ]
            await asyncio.gather(*link.pumps, return_exceptions=True)
        finally:
            self._links.discard(link)
            for w in (writer, link.upstream):
                if w is not None:
                    w.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        reader = loop.create_task(self._hold(src, held)) if self.delay > 0 else None
        try:
            while True:
                if reader is None:
                    data = await src.read(CHUNK)
                else:  # each chunk when its delay is over
                    due, data = await held.get()
                    await asyncio.sleep(max(0.0, due - loop.time()))
                await self._flowing.wait()  # frozen: hold it (and stop reading) until unfrozen
                if not data:
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                # counted first: the proxy runs in a thread of its own, and a client may read
                # the bytes before a count made after the write
                self.forwarded += len(data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            return
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    async def _hold(
        self, src: asyncio.StreamReader, held: asyncio.Queue[tuple[float, bytes]]
    ) -> None:
        """Read *src* into *held*, each chunk with the time it is due to be passed on, so that
        chunks keep their order without waiting for each other's delay."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await src.read(CHUNK)
            except (ConnectionError, OSError):
                data = b""  # the source is gone: end the other side after the delay
            held.put_nowait((loop.time() + self.delay, data))
            if not data:
                return


def main(argv: list[str] | None = None) -> int:
    """``python -m contend.testing.proxy HOST:PORT [LISTEN_PORT]``: forward, and read faults
    (freeze, unfreeze, cut, reset, heal, quit) one a line from stdin."""
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2 or ":" not in args[0]:
        print("usage: python -m contend.testing.proxy TARGET_HOST:PORT [LISTEN_PORT]")
        return 2
    host, _, port = args[0].rpartition(":")
    proxy = FaultProxy(host, int(port), port=int(args[1]) if len(args) > 1 else 0).start()
    print(f"forwarding 127.0.0.1:{proxy.port} -> {host}:{port}", flush=True)
    actions = {
        "freeze": proxy.freeze,
        "unfreeze": proxy.unfreeze,
        "cut": proxy.cut,
        "reset": proxy.reset,
        "heal": proxy.heal,
    }
    try:
        for line in sys.stdin:
            word = line.strip()
            if word in ("quit", "exit"):
                break
            if word in actions:
                actions[word]()
                print(f"{word}: ok ({proxy.mode})", flush=True)
            elif word:
                print(f"unknown: {word!r} (one of {', '.join(actions)}, quit)", flush=True)
    finally:
        proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
