"""proxy/sockets.py over real loopback sockets: what the kernel holds for a peer, and the reset."""

from __future__ import annotations

import asyncio
import socket

import pytest

from proxy.sockets import reset, unsent


async def pair() -> tuple[asyncio.WriteTransport, socket.socket, asyncio.Server]:
    """Our side as an asyncio transport (as aiohttp's server has it), the peer a plain socket with a
    small receive buffer that reads only when told."""
    accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(writer)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peer.setblocking(False)
    await asyncio.get_running_loop().sock_connect(peer, server.sockets[0].getsockname())
    writer = await asyncio.wait_for(accepted, 5)
    return writer.transport, peer, server  # type: ignore[return-value]


async def settle_queue(transport: asyncio.WriteTransport) -> int:
    """The kernel's queue once it stops moving (the peer's window is full)."""
    last = -1
    for _ in range(50):
        await asyncio.sleep(0.02)
        now = unsent(transport)
        assert now is not None
        if now == last:
            return now
        last = now
    return last


@pytest.mark.timeout(10)
async def test_unsent_holds_what_a_non_reader_left_and_shrinks_when_it_reads() -> None:
    transport, peer, server = await pair()
    try:
        assert unsent(transport) == 0
        transport.write(b"x" * 200_000)
        assert await settle_queue(transport) > 0  # the peer took no more: the kernel holds the rest for it
        got = 0
        while got < 200_000:
            got += len(await asyncio.wait_for(asyncio.get_running_loop().sock_recv(peer, 65536), 2))
        assert await settle_queue(transport) == 0
    finally:
        transport.abort()
        peer.close()
        server.close()


@pytest.mark.timeout(10)
async def test_reset_drops_what_was_queued_and_the_peer_sees_a_reset() -> None:
    transport, peer, server = await pair()
    try:
        transport.write(b"x" * 2**20)
        await settle_queue(transport)
        reset(transport)
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectionResetError):
            for _ in range(1000):  # what had arrived may be read first; then the reset, never an end
                assert await asyncio.get_running_loop().sock_recv(peer, 65536)
    finally:
        peer.close()
        server.close()


def test_unsent_without_a_socket_says_nothing() -> None:
    assert unsent(None) is None
