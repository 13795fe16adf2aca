"""The TCP fault proxy against a small echo server: pass, freeze, unfreeze, cut, reset, heal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from contend.testing.proxy import FaultProxy

#: How long a frozen path is watched for bytes that must not arrive.
QUIET = 0.3


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    p = FaultProxy("127.0.0.1", port).start()
    try:
        yield p
    finally:
        await asyncio.to_thread(p.close)
        server.close()
        await server.wait_closed()


async def connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", proxy.port), 5)


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, text: bytes) -> bytes:
    writer.write(text)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(text)), 5)


async def test_it_forwards_both_ways(proxy: FaultProxy) -> None:
    r, w = await connect(proxy)
    assert await ask(r, w, b"hello") == b"hello"
    assert proxy.connections == 1 and proxy.forwarded == 10
    w.close()


async def test_a_freeze_holds_every_byte_and_closes_nothing(proxy: FaultProxy) -> None:
    r, w = await connect(proxy)
    assert await ask(r, w, b"before") == b"before"
    await asyncio.to_thread(proxy.freeze)
    w.write(b"during")
    await w.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r.readexactly(6), QUIET)  # it vanished: no answer, no reset
    assert not r.at_eof()
    # a new connection is accepted and goes nowhere
    r2, w2 = await connect(proxy)
    w2.write(b"new")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r2.readexactly(3), QUIET)
    await asyncio.to_thread(proxy.unfreeze)  # held bytes are delivered
    assert await asyncio.wait_for(r.readexactly(6), 5) == b"during"
    assert await asyncio.wait_for(r2.readexactly(3), 5) == b"new"
    w.close()
    w2.close()


async def test_a_cut_resets_and_refuses_until_healed(proxy: FaultProxy) -> None:
    r, w = await connect(proxy)
    assert await ask(r, w, b"x") == b"x"
    await asyncio.to_thread(proxy.cut)
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await ask(r, w, b"y")
    with pytest.raises(ConnectionRefusedError):
        await connect(proxy)
    await asyncio.to_thread(proxy.heal)
    r2, w2 = await connect(proxy)  # the same port again
    assert await ask(r2, w2, b"back") == b"back"
    w2.close()


async def test_a_reset_ends_open_connections_only(proxy: FaultProxy) -> None:
    r, w = await connect(proxy)
    assert await ask(r, w, b"x") == b"x"
    await asyncio.to_thread(proxy.reset)
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await ask(r, w, b"y")
    r2, w2 = await connect(proxy)
    assert await ask(r2, w2, b"fresh") == b"fresh"
    w2.close()


def test_urls_are_pointed_at_the_proxy() -> None:
    p = FaultProxy("db", 5432, port=6000)
    assert p.url("postgresql://postgres@127.0.0.1:5432/x?a=1") == (
        "postgresql://postgres@127.0.0.1:6000/x?a=1"
    )
    assert p.url("etcd://127.0.0.1:2379/prefix") == "etcd://127.0.0.1:6000/prefix"


async def test_a_delay_adds_its_time_each_way_and_keeps_the_order() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    late = FaultProxy("127.0.0.1", server.sockets[0].getsockname()[1], delay=0.05).start()
    try:
        r, w = await connect(late)
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await ask(r, w, b"ping") == b"ping"
        took = loop.time() - began
        assert 0.1 <= took < 1.0, took  # 50 ms there, 50 ms back
        # chunks sent back to back arrive in order and do not queue behind each other's delay
        began = loop.time()
        for n in range(5):
            w.write(b"%d," % n)
            await w.drain()
        got = await asyncio.wait_for(r.readexactly(10), 5)
        assert got == b"0,1,2,3,4,"
        assert loop.time() - began < 0.5
        w.close()
    finally:
        await asyncio.to_thread(late.close)
        server.close()
        await server.wait_closed()


def test_a_delay_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="delay must be from 0 to 60 seconds"):
        FaultProxy("127.0.0.1", 1, delay=-1)
