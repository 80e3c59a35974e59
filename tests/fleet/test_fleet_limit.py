"""``max_concurrent`` is the fleet's: a box of two workers (two processes, one real redis-server) keeps
a provider under its one limit, each worker running its share; with Redis gone each worker runs its
own whole limit (fail open). Read from the upstream, which counts the calls it holds at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from ..conftest import chat_body
from ..redis_server import RedisServer
from .conftest import PATH, Box, box_config, target

pytestmark = pytest.mark.timeout(150)

LIMIT = 4
SLOW = 0.6  # each call holds the upstream this long


class Counting:
    """An upstream that answers after SLOW and remembers the most calls it held at once."""

    def __init__(self) -> None:
        self.now = self.most = self.calls = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.now += 1
        self.calls += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(SLOW)
        finally:
            self.now -= 1
        return web.json_response(chat_body("ok"))


def limited(redis: RedisServer, url: str) -> dict[str, Any]:
    cfg = box_config(redis, {"up": url})
    cfg["providers"]["up"].update({"max_concurrent": LIMIT, "queue": 8})
    cfg["providers"]["up"]["timeouts"]["first_chunk"] = 10
    return cfg


async def pinned(box: Box, per_worker: int) -> list[tuple[aiohttp.ClientSession, int]]:
    """``per_worker`` keep-alive connections to each worker (a session holds one; /v1/health says
    whose it is), so the load reaches both workers evenly whatever the kernel's hash does."""
    kept: list[tuple[aiohttp.ClientSession, int]] = []
    count = {0: 0, 1: 0}
    for _ in range(200):
        if min(count.values()) >= per_worker:
            return kept
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        async with session.get(box.url + "/v1/health") as resp:
            worker = orjson.loads(await resp.read())["box"]["worker"]
        if count[worker] < per_worker:
            count[worker] += 1
            kept.append((session, worker))
        else:
            await session.close()
    raise AssertionError(f"could not reach both workers: {count}")


async def burst(kept: list[tuple[aiohttp.ClientSession, int]], box: Box) -> list[int]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}

    async def one(session: aiohttp.ClientSession) -> int:
        async with session.post(box.url + PATH, json=body) as resp:
            await resp.read()
            return resp.status

    return await asyncio.gather(*(one(s) for s, _ in kept))


async def fleet_state(box: Box, kept: list[tuple[aiohttp.ClientSession, int]], want: str) -> None:
    deadline = time.monotonic() + 20
    for session, _ in kept:
        while True:
            async with session.get(box.url + "/v1/health") as resp:
                health = orjson.loads(await resp.read())
            if health["fleet"]["state"] == want and (want == "alone" or health["fleet"]["peers"]):
                break
            assert time.monotonic() < deadline, health["fleet"]
            await asyncio.sleep(0.05)


async def test_max_concurrent_is_the_fleets_across_two_workers(redis_server, upstreams, boxes) -> None:
    up = Counting()
    box = await boxes(limited(redis_server, (await upstreams({PATH: up.handle})).url))
    kept = await pinned(box, 4)
    try:
        await fleet_state(box, kept, "in-fleet")  # each has heard the other: the limit is split 2 + 2
        started = time.monotonic()
        assert await burst(kept, box) == [200] * 8  # 8 at once, 4 on each worker: half of them queue
        assert up.calls == 8 and up.most <= LIMIT
        assert time.monotonic() - started >= 2 * SLOW  # two rounds: nobody ran over the fleet's limit
        async with kept[0][0].get(box.url + "/v1/health") as resp:
            assert target(orjson.loads(await resp.read()), "up")["in_flight"] == 0
    finally:
        for session, _ in kept:
            await session.close()


async def test_with_redis_down_each_worker_runs_its_own_limit(own_redis, upstreams, boxes) -> None:
    up = Counting()
    box = await boxes(limited(own_redis, (await upstreams({PATH: up.handle})).url))
    kept = await pinned(box, LIMIT)
    try:
        await fleet_state(box, kept, "in-fleet")
        own_redis.kill()
        await fleet_state(box, kept, "alone")
        assert await burst(kept, box) == [200] * 8
        assert up.most > LIMIT  # fail open: each worker its whole limit, none waited on Redis
    finally:
        for session, _ in kept:
            with contextlib.suppress(Exception):
                await session.close()


async def test_a_limit_below_the_workers_is_said_at_start_by_the_placeless_worker_and_at_reload(
        redis_server, upstreams, boxes) -> None:
    """``max_concurrent: 1`` on two workers: one of them holds no place and fails its calls over at
    once while the upstream idles (docs/adr/0016). The supervisor says so once at the start and at a
    reload (what to set instead), and the worker with no place says so when it finds itself without."""
    up = Counting()
    cfg = limited(redis_server, (await upstreams({PATH: up.handle})).url)
    cfg["providers"]["up"]["max_concurrent"] = 1
    box = await boxes(cfg)
    advice = ("providers.up.max_concurrent: 1 is split among 2 workers (routes: chat); 1 of them gets no place, "
              "so their calls to up fail over at once")
    placeless = "providers.up.max_concurrent: 1 is split among the fleet's 2 live members"
    deadline = time.monotonic() + 20
    while box.log.read_text().count(placeless) < 1:
        assert time.monotonic() < deadline, box.log.read_text()
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # a second worker that also said it would be a wrong warning
    text = box.log.read_text()
    assert text.count(advice) == 1 and text.count(placeless) == 1, text
    assert "set max_concurrent to at least 2 (the fleet's whole limit, split: docs/adr/0016), or workers to " \
           "at most 1" in text
    kept = await pinned(box, 1)
    try:  # one call at a time to each worker: the one without a place answers why, in words
        answers = []
        for session, _ in kept:
            async with session.post(box.url + PATH, json={"model": "chat", "messages": []}) as resp:
                answers.append((resp.status, orjson.loads(await resp.read())))
    finally:
        for session, _ in kept:
            await session.close()
    assert sorted(status for status, _ in answers) == [200, 503], answers
    refused = next(body for status, body in answers if status == 503)["error"]
    assert refused["code"] == "busy" and "holds no place of the provider's max_concurrent (1)" in refused["message"]
    assert box.proc is not None
    box.proc.send_signal(signal.SIGHUP)
    while "reload passed to 2 workers" not in box.log.read_text():
        assert time.monotonic() < deadline + 20, box.log.read_text()
        await asyncio.sleep(0.05)
    text = box.log.read_text()
    assert text.count(advice) == 2 and text.count(placeless) == 2, text
