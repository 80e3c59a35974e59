"""A cold fleet measures each target once per mode (docs/adr/0016, "one measure per target"):
three real ``firstbyte serve`` processes and one real redis-server, hit at the same instant; fake
upstreams count the calls each target gets in each mode."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

from ..conftest import chat_body, chunk_event
from .conftest import PATH, Instance, config

TARGETS = {"a": 0.01, "b": 0.03, "c": 0.06}  # written order a, b, c: alone, each instance measures a first
MODES = ("streamed", "buffered")


def counting(name: str, delay: float, calls: Counter[tuple[str, str]]) -> Any:
    """Answers as the request asks (a stream or one body) after ``delay``, counting (target, mode)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        calls[(name, "streamed" if body.get("stream") else "buffered")] += 1
        await asyncio.sleep(delay)
        if not body.get("stream"):
            return web.json_response(chat_body("ok"))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("ok"))
        await response.write(chunk_event("", "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


async def ask(session: aiohttp.ClientSession, inst: Instance, mode: str) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": mode == "streamed"}
    async with session.post(inst.url + PATH, json=body) as resp:
        await resp.read()
        return resp.status


async def cold_fleet(redis: Any, upstreams: Any, instances: Any) -> tuple[list[Instance], Counter[tuple[str, str]]]:
    calls: Counter[tuple[str, str]] = Counter()
    urls = {n: (await upstreams({PATH: counting(n, d, calls)})).url for n, d in TARGETS.items()}
    fleet = f"m-{uuid.uuid4().hex[:8]}"
    return [await instances(config(redis, fleet, urls, strategy="fastest")) for _ in range(3)], calls


async def hit_at_once(session: aiohttp.ClientSession, fleet_: list[Instance]) -> None:
    """One streamed and one buffered request to every instance, all six at the same instant."""
    statuses = await asyncio.gather(*(ask(session, inst, mode) for inst in fleet_ for mode in MODES))
    assert statuses == [200] * 6


async def test_a_cold_fleet_hit_at_once_measures_each_target_once_per_mode(redis_server, upstreams,
                                                                          instances) -> None:
    fleet_, calls = await cold_fleet(redis_server, upstreams, instances)
    async with aiohttp.ClientSession() as session:
        for _ in range(100):  # the claims are taken ahead, off the request path: let the last one settle
            held = [(await inst.health(session))["fleet"].get("measuring", []) for inst in fleet_]
            if all(len(h) == len(MODES) for h in held):
                break
            await asyncio.sleep(0.05)
        await hit_at_once(session, fleet_)
    # Exactly one call per target per mode: three instances, three unmeasured targets, each instance
    # holding the claim of a different one in each mode, so each request goes to the target its
    # instance measures. Alone (or on a fleet without the claims) all six went to a: 3 + 3.
    assert calls == Counter({(n, m): 1 for n in TARGETS for m in MODES})


async def test_redis_down_each_instance_measures_for_itself(own_redis, upstreams, instances) -> None:
    fleet_, calls = await cold_fleet(own_redis, upstreams, instances)
    own_redis.kill()
    async with aiohttp.ClientSession() as session:
        for inst in fleet_:  # fail open: the claims a dead Redis held bind nobody
            for _ in range(100):
                health = await inst.health(session)
                if health["fleet"]["state"] == "alone":
                    break
                await asyncio.sleep(0.05)
            assert health["fleet"]["state"] == "alone" and "measuring" not in health["fleet"]
        await hit_at_once(session, fleet_)
    assert calls == Counter({("a", m): 3 for m in MODES})  # each measured a itself, as a lone instance does
