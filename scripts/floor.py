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

    python scripts/floor.py --port 8100 --upstream http://127.0.0.1:9100 [--commit] [--pick A=URL ...]
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)
PICKS = web.AppKey("picks", dict)


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
    return await _committed(request, request.app[UPSTREAM])


async def relay_picked(request: web.Request) -> web.StreamResponse:
    """``relay_committed`` to the upstream the request's ``x-route-provider`` names (``--pick``): the floor
    pinned as firstbyte's ``oracle`` is, beside a direct client (``scripts/simulate-pool --direct``)."""
    return await _committed(request, request.app[PICKS][request.headers["x-route-provider"]])


async def _committed(request: web.Request, upstream: str) -> web.StreamResponse:
    body = await request.read()
    session = request.app[SESSION]
    async with session.post(upstream + request.path, data=body,
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


def build(upstream: str, commit: bool = False, picks: dict[str, str] | None = None) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream.rstrip("/")
    app[PICKS] = {name: url.rstrip("/") for name, url in (picks or {}).items()}

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session)
    app.router.add_post("/{tail:.*}", relay_picked if picks else relay_committed if commit else relay)
    return app


async def main(args: argparse.Namespace) -> None:
    picks = dict(pick.split("=", 1) for pick in args.pick)
    runner = web.AppRunner(build(args.upstream, args.commit, picks), access_log=None, handler_cancellation=True)
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
    p.add_argument("--pick", action="append", default=[], metavar="NAME=URL",
                   help="an upstream x-route-provider may name (committed, as --commit); repeat per upstream")
    uvloop.run(main(p.parse_args()))
