"""gateway.py: the running whole; here its drain's cut (``cut_streams``), over real loopback HTTP."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from proxy.walk.lease import Lease

from .conftest import CHAT, chunk_event, openai_provider, route_config, until


async def test_the_drains_cut_counts_no_stream_whose_client_already_has_the_whole_answer(upstreams, proxy):
    """After [DONE] the lease stays in deadlines.calls while its upstream tail is read in the
    background (finish_after_end). cut_streams() counts it, and serve() logs 'N stream(s) ended
    with an error event' for clients that had their whole answer."""
    async def lingering(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("hi") + chunk_event("", "stop") + b"data: [DONE]\n\n")
        await asyncio.sleep(3)  # the upstream's own end of body comes late
        await response.write_eof()
        return response

    up = await upstreams({"/v1/chat/completions": lingering})
    p = await proxy(route_config([{"provider": "a", "model": "m"}], {"a": openai_provider(up.url)}))
    status, _, body = await asyncio.wait_for(p.post("/v1/chat/completions", {**CHAT, "stream": True}), 5)
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")  # the client has it all
    assert p.gateway.cut_streams() == 0, "a finished answer was counted as a stream cut by the drain"


async def test_the_drains_cut_ends_a_stream_blocked_writing_to_a_client_that_does_not_read(upstreams, proxy):
    """cut_streams() only aborts the upstream read. A relay blocked in response.write() on a client
    that stopped reading never gets to that read: the stream is not ended at the grace, and the
    shutdown waits until aiohttp's own timeout cancels it (no word, logged 'client disconnected')."""
    big = chunk_event("x" * (256 * 1024))

    async def firehose(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        try:
            for _ in range(400):  # 100 MB, far more than the sockets between can hold
                await response.write(big)
            await response.write(chunk_event("", "stop") + b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        return response

    up = await upstreams({"/v1/chat/completions": firehose})
    p = await proxy(route_config([{"provider": "a", "model": "m"}], {"a": openai_provider(up.url)}))
    gw = p.gateway
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", p.port))
    body = b'{"model":"chat","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    await asyncio.get_running_loop().sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                                  b"Content-Type: application/json\r\n"
                                                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    try:  # the client never reads

        def leases() -> list[Lease]:
            return [c for c in gw.deadlines.calls if isinstance(c, Lease)]

        await until(lambda: bool(leases()), 5)
        [lease] = leases()
        await asyncio.sleep(1.0)  # the relay's writes have backed up by now
        assert lease.waiting_since is None  # it is writing to the client, not reading the upstream
        assert gw.cut_streams() == 1
        await until(lambda: lease.finished, 2)
        assert lease.finished, "the drain's cut left the stream running: the relay is blocked writing"
    finally:
        sock.close()
