"""What the link sends per call: entries that carry many calls' events, and a heartbeat on a timer.

Each stream entry is an XADD from this instance and an XREAD reply at every member; in a fleet of
three, each of them also folds every peer entry. So the entries an instance sends bound the fleet's
cost per call (docs/adr/0016, "Cost per call"): in-flight counts go out on the heartbeat, not at
each change, and what comes while one entry is being sent, or just after, goes in the next.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import aiohttp
import orjson
import redis.asyncio as aioredis

from proxy.fleet.link import HEARTBEAT, SEND_GAP
from proxy.fleet.wire import stream_key

from ..conftest import status_handler
from ..redis_server import PASSWORD
from .test_link import CHAT, fleet_config, fleet_of, ok, post

LOAD_SECS = 1.6  # long enough for three heartbeats under load


async def test_calls_share_entries_and_in_flight_counts_go_on_the_heartbeat(redis_server, upstreams,
                                                                            proxy) -> None:
    up = await upstreams({"/v1/chat/completions": ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    (p,) = await fleet_of(1, proxy, fleet_config(redis_server, fleet, {"up": up.url}))
    client = aioredis.Redis.from_url(redis_server.url, password=PASSWORD)
    try:
        first = (await client.xrevrange(stream_key(fleet), count=1) or [(b"0-0", {})])[0][0]
        start = time.monotonic()
        async with aiohttp.ClientSession() as session:

            async def caller() -> list[int]:  # 8 of them, each call right after the last: counts move
                return [await post(session, p) for _ in iter(lambda: time.monotonic() - start < LOAD_SECS, False)]

            statuses = [s for one in await asyncio.gather(*(caller() for _ in range(8))) for s in one]
            assert set(statuses) == {200}
        await asyncio.sleep(2 * SEND_GAP)  # the last samples sent
        elapsed = time.monotonic() - start
        entries = await client.xrange(stream_key(fleet), min=f"({first.decode()}")
    finally:
        await client.aclose()
    events = [e for _, fields in entries for e in orjson.loads(fields[b"e"])]
    assert sum(e[0] == "s" for e in events) == len(statuses)  # every sample travels
    beats = sum(e[0] == "n" for e in events)
    assert beats <= elapsed / HEARTBEAT + 2, (beats, elapsed)  # not one per change of a count
    assert beats >= LOAD_SECS / HEARTBEAT - 1, (beats, elapsed)  # and the heartbeat goes on under load
    assert len(entries) <= elapsed / SEND_GAP + beats + 2, (len(entries), elapsed)


async def test_a_breaker_opening_does_not_wait_for_the_send_gap(redis_server, upstreams, proxy) -> None:
    good = await upstreams({"/v1/chat/completions": ok})
    bad = await upstreams({"/v1/chat/completions": status_handler(503)})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    raw = fleet_config(redis_server, fleet, {"good": good.url, "bad": bad.url}, failures=1)
    raw["routes"] = {"chat": {"strategy": "ordered", "targets": [{"provider": "good", "model": "m"}]},
                     "bad": {"strategy": "ordered", "cooldown": {"failures": 1, "secs": 30.0},
                             "targets": [{"provider": "bad", "model": "m"}]}}
    (p,) = await fleet_of(1, proxy, raw)
    client = aioredis.Redis.from_url(redis_server.url, password=PASSWORD)
    try:
        async with aiohttp.ClientSession() as session:
            assert await post(session, p) == 200  # its sample goes at once; the send gap starts
            async with session.post(p.url + "/v1/chat/completions", json={**CHAT, "model": "bad"}) as resp:
                assert resp.status >= 500  # the one failure opens the breaker
        await asyncio.sleep(2 * SEND_GAP)
        entries = await client.xrange(stream_key(fleet))
    finally:
        await client.aclose()
    sent = [(int(entry_id.split(b"-")[0]) / 1000, e) for entry_id, fields in entries
            for e in orjson.loads(fields[b"e"])]
    (at, opening), = [(at, e) for at, e in sent if e[0] == "o"]
    opened = opening[2] - opening[3]  # its deadline less its cooldown: when it opened, wall clock
    assert at - opened < SEND_GAP / 2, at - opened  # sent at once, not after what is left of the gap
