"""The floor: the smallest aiohttp relay that does what firstbyte's hot path does.

One handler forwards the client's body to one upstream with a shared
``ClientSession`` and streams the answer back chunk by chunk. No routing, no
parsing, no logging. ``scripts/bench`` measures firstbyte against it in the
same run: whatever firstbyte adds beyond this is the price of its features.

``--commit`` holds the status and headers until the upstream's first chunk, as
firstbyte must (it may still fail over until then: docs/adr/0001, 0007). The
plain floor sends them while the upstream is still thinking, which no gateway
that fails over can do; the bench shows both, so the price of committing late
and the price of firstbyte's own work read apart.

    python scripts/floor.py --port 8100 --upstream http://127.0.0.1:9100 [--commit]
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    session = request.app[SESSION]
    async with session.post(request.app[UPSTREAM] + request.path, data=body,
                            headers={"content-type": "application/json"}) as up:
        response = web.StreamResponse(status=up.status,
                                      headers={"content-type": up.headers.get("content-type", "")})
        await response.prepare(request)
        async for chunk in up.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def relay_committed(request: web.Request) -> web.StreamResponse:
    """``relay``, but the status and headers wait for the upstream's first chunk (``--commit``).
    A handler of its own, so the plain floor runs exactly the code it always ran."""
    body = await request.read()
    session = request.app[SESSION]
    async with session.post(request.app[UPSTREAM] + request.path, data=body,
                            headers={"content-type": "application/json"}) as up:
        first = await up.content.readany()
        response = web.StreamResponse(status=up.status,
                                      headers={"content-type": up.headers.get("content-type", "")})
        await response.prepare(request)
        await response.write(first)
        async for chunk in up.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


def build(upstream: str, commit: bool = False) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app.router.add_post("/{tail:.*}", relay_committed if commit else relay)
    return app


async def main(args: argparse.Namespace) -> None:
    runner = web.AppRunner(build(args.upstream, args.commit), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port, backlog=4096, reuse_address=True).start()
    print(f"floor on http://{args.host}:{args.port} -> {args.upstream}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9100")
    p.add_argument("--commit", action="store_true", help="hold the headers until the first chunk")
    uvloop.run(main(p.parse_args()))
