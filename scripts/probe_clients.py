"""Issue 31's client probes at the issue's own numbers, against ``firstbyte serve`` in a subprocess.

    .venv/bin/python scripts/probe_clients.py [--port 18300]

1. Two clients ask for a stream from an endless upstream behind a ``max_concurrent: 2`` provider with
   ``total: 15`` and stop reading (4 KB receive buffers, never read). A reading client asks once a
   second; printed: how long every ask was ``busy`` until one was served.
2. ``connections.max: 200``: 200 keep-alive connections each ask ``GET /healthz`` and then every 12 s;
   then 50 new clients each ask once. Printed: how many newcomers were served and how many got 503.

Ports: ``--port`` for firstbyte, the next one for the fake upstream. Bounded: about 40 s in all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


async def endless(request: web.Request) -> web.StreamResponse:
    """An upstream that streams 16 KB events until its client goes."""
    body = await request.json()
    event = b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                    "choices": [{"index": 0, "delta": {"content": "x" * 16384},
                                                 "finish_reason": None}]}).encode() + b"\n\n"
    if not body.get("stream"):
        return web.json_response({"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    try:
        while True:
            await response.write(event)
            await asyncio.sleep(0)
    except (ConnectionError, asyncio.CancelledError):
        return response


async def ask(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def post(body: dict[str, object]) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw))


async def non_readers(port: int) -> None:
    socks = []
    loop = asyncio.get_running_loop()
    for _ in range(2):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, post({**CHAT, "stream": True}))
        socks.append(sock)
    await asyncio.sleep(0.5)
    t0, busy = time.monotonic(), 0
    while time.monotonic() - t0 < 25:
        answer = await ask(port, post(CHAT))
        if answer.startswith(b"HTTP/1.1 200"):
            print(f"non-readers: a reading client was served after {time.monotonic() - t0:.1f} s "
                  f"({busy} busy answers before); before issue 31 they held the slots until they left")
            break
        busy += 1
        await asyncio.sleep(1)
    else:
        print(f"non-readers: still busy after 25 s ({busy} busy answers)")
    for sock in socks:
        sock.close()


async def idle_fill(port: int) -> None:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(200)]

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):  # ask now and again 12 s later, as the connections did
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                await asyncio.wait_for(reader.readuntil(b"}"), 5)
            except (ConnectionError, asyncio.IncompleteReadError):
                return
            await asyncio.sleep(12)

    keepers = [asyncio.create_task(keep(*c)) for c in conns]
    await asyncio.sleep(1)
    got = [await ask(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") for _ in range(50)]
    served = sum(a.startswith(b"HTTP/1.1 200") for a in got)
    refused = sum(b"too_many_connections" in a for a in got)
    print(f"idle fill: 200 keep-alive connections at connections.max 200; 50 newcomers: {served} served, "
          f"{refused} got 503 too_many_connections")
    for task in keepers:
        task.cancel()
    for _, writer in conns:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=18300)
    port = parser.parse_args().port
    app = web.Application()
    app.router.add_post("/v1/chat/completions", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port + 1).start()
    config = {"listen": f"127.0.0.1:{port}", "connections": {"max": 200},
              "providers": {"up": {"kind": "openai", "base_url": f"http://127.0.0.1:{port + 1}/v1",
                                   "max_concurrent": 2, "timeouts": {"total": 15}}},
              "routes": {"chat": {"targets": [{"provider": "up", "model": "m"}]}}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "routes.json"
        path.write_text(json.dumps(config))
        proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--config", str(path)],
                                stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    if (await ask(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")):
                        break
                except OSError:
                    await asyncio.sleep(0.1)
            await non_readers(port)
            await idle_fill(port)
        finally:
            proc.terminate()
            proc.wait(10)
            await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
