"""``firstbyte simulate``: the simulated provider on real HTTP, OpenAI-compatible.

Benchmarks and the routing-quality harness point firstbyte (and a direct
client) at it. ``--schedule`` changes the knobs over time, so a harness knows
which target was fastest at each moment.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
from aiohttp import web

from ..config import Simulate
from .simulator import Simulator

log = logging.getLogger("firstbyte.simulate")
SIMULATOR = web.AppKey("simulator", Simulator)
_OPS = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
        "/v1/embeddings": "embeddings"}


def load_schedule(path: str, base: Simulate) -> Callable[[float], Simulate]:
    """A JSON list of ``{"at": seconds, <knob>: value}``; each step applies from its time on."""
    steps = sorted(orjson.loads(Path(path).read_bytes()), key=lambda s: s["at"])
    times = [float(s["at"]) for s in steps]
    knobs = [replace(base, **{k: v for k, v in s.items() if k != "at"}) for s in steps]

    def at(elapsed: float) -> Simulate:
        i = bisect.bisect_right(times, elapsed) - 1
        return base if i < 0 else knobs[i]

    return at


async def answer(request: web.Request) -> web.StreamResponse:
    sim = request.app[SIMULATOR]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return web.json_response({"error": {"message": "bad JSON", "type": "invalid_request_error",
                                             "param": None, "code": None}}, status=400)
    reply = await sim.answer(_OPS[request.path], body)
    if reply.stream is None:
        return web.Response(body=reply.body, status=reply.status, headers=reply.headers)
    response = web.StreamResponse(status=reply.status, headers=reply.headers)
    await response.prepare(request)
    async for chunk in reply.stream:
        await response.write(chunk)
    await response.write_eof()
    return response


async def stats(request: web.Request) -> web.Response:
    sim = request.app[SIMULATOR]
    knobs = sim.current()
    return web.json_response({"name": sim.name, "served": sim.served,
                              "first_chunk_ms": knobs.first_chunk_ms,
                              "fail_rate": knobs.fail_rate, "stalled": sim.stalled, "cold": sim.cold,
                              "elapsed_s": sim.clock() - sim.started})  # where it is in its schedule


async def restart(request: web.Request) -> web.Response:
    """``POST /sim/restart``: the schedule starts again from now and the counts from zero, so a harness
    that starts several processes (slowly, on a busy machine) begins its load at the schedule's start."""
    sim = request.app[SIMULATOR]
    sim.started = sim.clock()
    sim.served, sim.stalled, sim.cold = 0, 0, None
    return web.json_response({"name": sim.name, "elapsed_s": 0.0})


def build_sim_app(sim: Simulator) -> web.Application:
    app = web.Application()
    app[SIMULATOR] = sim
    for path in _OPS:
        app.router.add_post(path, answer)
    app.router.add_get("/sim/stats", stats)
    app.router.add_post("/sim/restart", restart)
    return app


def knobs_from_args(args: argparse.Namespace) -> Simulate:
    return Simulate(first_chunk_ms=args.first_chunk_ms, jitter_ms=args.jitter_ms,
                    chunk_ms=args.chunk_ms, chunks=args.chunks, fail_rate=args.fail_rate,
                    fail_status=args.fail_status, seed=args.seed, stall_rate=args.stall_rate,
                    stall_ms=args.stall_ms, load_ms=args.load_ms)


async def serve_simulator(args: argparse.Namespace) -> int:
    knobs = knobs_from_args(args)
    schedule = load_schedule(args.schedule, knobs) if args.schedule else None
    sim = Simulator(knobs, name=f"sim:{args.port}", schedule=schedule)
    runner = web.AppRunner(build_sim_app(sim), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=2048, reuse_address=True)
    await site.start()
    log.info("simulated provider on http://%s:%d/v1", args.host, args.port)
    print(f"simulated provider on http://{args.host}:{args.port}/v1", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
    return 0


