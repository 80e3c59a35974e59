"""CPU per upstream call: aiohttp's ClientSession against firstbyte's pool (proxy/upstream/http1.py).

Both call the same raw asyncio server on loopback (in this process) with the same request and read a
17-event answer to its end, ``--calls`` times, three rounds; printed is CPU time per call (the
server's share included, the same for both). It is the measurement behind docs/adr/0011.

    .venv/bin/python scripts/client_cost.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
import uvloop

from proxy.upstream.http1 import Pool

BODY = b'data: {"x":1}\n\n' * 16 + b"data: [DONE]\n\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
PAYLOAD = b'{"model":"x","stream":true,"messages":[{"role":"user","content":"hi"}]}'
HEADERS = {"content-type": "application/json", "authorization": "Bearer k"}


class Upstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            self.transport.write(ANSWER)  # type: ignore[attr-defined]


async def main(calls: int) -> None:
    server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    pool = Pool()
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(calls):
            async with session.post(url, data=PAYLOAD, headers=HEADERS) as resp:
                while await resp.content.readany():
                    pass
        t1 = time.process_time()
        for _ in range(calls):
            answer = await pool.request("POST", url, HEADERS, PAYLOAD, 5.0)
            while await answer.content.readany():
                pass
            pool.release(answer)
        t2 = time.process_time()
        print(f"ClientSession {(t1 - t0) / calls * 1e6:6.1f} us/call    pool {(t2 - t1) / calls * 1e6:6.1f} us/call")
    await session.close()
    pool.close()
    server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    uvloop.run(main(p.parse_args().calls))
