"""The fleet link in process: two or three gateways on loopback sharing one real redis-server.

Fast checks of what the link does (fleet-wide failures, the breaker's spread, one probe, samples
shared by fleet id, Redis killed and back, a wrong password); ``test_fleet_processes.py`` runs the
same fleet as real ``firstbyte serve`` processes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from proxy.fleet import backlog, measures
from proxy.fleet.link import BATCH, HEARTBEAT, served
from proxy.fleet.wire import fleet_ids, stream_key

from ..conftest import Proxy, chat_body, chunk_event, make_config, openai_provider, status_handler
from ..redis_server import PASSWORD, RedisServer

PATH = "/v1/chat/completions"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
ENV = {"FLEET_PASSWORD": PASSWORD}


def fleet_config(redis: RedisServer, fleet: str, urls: dict[str, str], failures: int = 3,
                 secs: float = 30.0, password_env: str | None = "FLEET_PASSWORD") -> dict[str, Any]:
    """One ordered route over the named upstreams, in the fleet ``fleet``."""
    state: dict[str, Any] = {"redis": redis.url, "fleet": fleet}
    if password_env:
        state["password_env"] = password_env
    return {
        "state": state,
        "providers": {name: openai_provider(url, timeouts={"connect": 1, "first_chunk": 2})
                      for name, url in urls.items()},
        "routes": {"chat": {"strategy": "ordered", "cooldown": {"failures": failures, "secs": secs},
                            "targets": [{"provider": name, "model": "m"} for name in urls]}},
    }


async def until(predicate: Callable[[], bool], secs: float = 5.0) -> float:
    """Wait for ``predicate``; returns how long it took."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < secs, "not within the bound"
        await asyncio.sleep(0.002)
    return time.monotonic() - start


def counting(handler: Any) -> tuple[list[int], Any]:
    calls: list[int] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        return await handler(request)

    return calls, handle


async def ok(request: web.Request) -> web.StreamResponse:
    await request.read()
    return web.json_response(chat_body("fine"))


async def fleet_of(n: int, proxy: Any, raw: dict[str, Any]) -> list[Proxy]:
    ps = [await proxy(raw, ENV) for _ in range(n)]
    for p in ps:
        assert p.gateway.fleet is not None
        await until(lambda p=p: p.gateway.fleet.connected)
    return ps


async def fleet_member(server, upstreams, proxy, handler, strategy: str | None = None
                       ) -> tuple[Proxy, aioredis.Redis, str]:
    """A fleet of one on a fresh fleet name, its route over one upstream answering with ``handler``
    (``strategy`` if given), and a client of its Redis (the caller closes it)."""
    up = await upstreams({PATH: handler})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    raw = fleet_config(server, fleet, {"up": up.url})
    if strategy is not None:
        raw["routes"]["chat"]["strategy"] = strategy
    (p,) = await fleet_of(1, proxy, raw)
    return p, aioredis.Redis.from_url(server.url, password=PASSWORD), fleet


async def post(session: aiohttp.ClientSession, p: Proxy) -> int:
    async with session.post(p.url + PATH, json=CHAT) as resp:
        await resp.read()
        return resp.status


async def test_failures_are_counted_fleet_wide_and_the_breaker_spreads(redis_server, upstreams, proxy) -> None:
    calls, failing = counting(status_handler(503))
    bad = await upstreams({PATH: failing})
    good = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    ps = await fleet_of(3, proxy, fleet_config(redis_server, fleet, {"bad": bad.url, "good": good.url}))
    async with aiohttp.ClientSession() as session:
        for p in itertools.islice(itertools.cycle(ps), 12):  # round robin, one call at a time
            assert await post(session, p) == 200
            await asyncio.sleep(0.02)  # a client's pace; the fleet's news takes a few ms
    assert len(calls) == 3  # threshold in all, not 3 per instance
    for p in ps:
        assert p.gateway.state.health(("bad", "m"), p.gateway.clock()).state == "open"


async def test_failures_that_come_together_open_the_breaker_everywhere_before_the_next_round(
        redis_server, upstreams, proxy) -> None:
    """Three calls at once, one an instance, all fail: each instance hears the other two at once, so the
    fleet sends the failing target ``threshold`` calls, not twice that. A reader that had just read an
    entry waited its gap (20 ms; here 5 s, to make it plain) before the next read, the peers' failures
    with it: at concurrency 3 `scripts/fleet_drill.py` read 6 failed calls at threshold 3 (goal 5)."""
    calls, failing = counting(status_handler(503))
    bad = await upstreams({PATH: failing})
    good = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    ps = await fleet_of(3, proxy, fleet_config(redis_server, fleet, {"bad": bad.url, "good": good.url}))
    for p in ps:
        p.gateway.fleet.read_gap = 5.0
    async with aiohttp.ClientSession() as session:
        assert await asyncio.gather(*(post(session, p) for p in ps)) == [200] * 3
        await until(lambda: all(p.gateway.state.health(("bad", "m"), p.gateway.clock()).state == "open"
                                for p in ps), secs=1.0)
        assert await asyncio.gather(*(post(session, p) for p in ps)) == [200] * 3
    assert len(calls) == 3


async def test_a_breaker_opened_on_one_excludes_on_the_others_within_100ms(redis_server, upstreams, proxy) -> None:
    bad = await upstreams({PATH: status_handler(503)})
    good = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    ps = await fleet_of(3, proxy, fleet_config(redis_server, fleet, {"bad": bad.url, "good": good.url}, failures=1))
    key = ("bad", "m")
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        assert await post(session, ps[0]) == 200  # its one failure opens the breaker there
        for p in ps[1:]:
            await until(lambda p=p: not p.gateway.state.health(key, p.gateway.clock()).usable, 0.1 + (
                time.monotonic() - start))
    # the same opening, not a second one counted here
    assert {p.gateway.state.targets[key].breaker.failures for p in ps} == {1}


async def test_one_probe_for_the_whole_fleet(redis_server, upstreams, proxy) -> None:
    calls, failing = counting(status_handler(503))
    bad = await upstreams({PATH: failing})
    good = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    ps = await fleet_of(3, proxy, fleet_config(redis_server, fleet, {"bad": bad.url, "good": good.url},
                                               failures=1, secs=1.0))
    async with aiohttp.ClientSession() as session:
        assert await post(session, ps[0]) == 200
        assert len(calls) == 1
        await asyncio.sleep(1.3)  # the cooldown is over everywhere: one instance holds the claim
        for _ in range(4):  # every instance gets requests while the target is half-open
            await asyncio.gather(*(post(session, p) for p in ps))
    # the first failure and one probe (it failed: the cooldown doubled to 2 s, longer than the rounds)
    assert len(calls) == 2


async def test_a_target_measured_by_one_is_measured_for_all_under_any_name(redis_server, upstreams, proxy) -> None:
    up = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    a = (await fleet_of(1, proxy, fleet_config(redis_server, fleet, {"groq": up.url})))[0]
    b = (await fleet_of(1, proxy, fleet_config(redis_server, fleet, {"fast-one": up.url})))[0]
    async with aiohttp.ClientSession() as session:
        assert await post(session, a) == 200
    await until(lambda: b.gateway.state.tracker.samples(("fast-one", "m"), "buffered") == 1, 1.0)
    assert b.gateway.state.tracker.samples(("fast-one", "m"), "streamed") == 0  # one series per mode


async def test_redis_down_fails_open_and_the_fleet_rejoins(own_redis, upstreams, proxy) -> None:
    up = await upstreams({PATH: ok})
    ps = await fleet_of(2, proxy, fleet_config(own_redis, "down", {"up": up.url}))
    own_redis.kill()
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        statuses = [await post(session, p) for p in ps for _ in range(5)]
        assert statuses == [200] * 10 and time.monotonic() - started < 2.0  # nobody waits for Redis
        for p in ps:
            await until(lambda p=p: not p.gateway.fleet.connected, 2.0)
            status = (await p.get("/v1/health"))[1]["fleet"]
            assert status["state"] == "alone" and "unreachable" in status["reason"]
            assert not status["reason"].endswith("."), status  # "Connection refused.; carrying on alone" read oddly
        own_redis.start()  # back, empty (persistence off): as good as flushed
        for p in ps:
            await until(lambda p=p: p.gateway.fleet.connected, 8.0)
        assert await post(session, ps[0]) == 200
    # its own five, then the one ps[0] took after the rejoin (what each learnt alone stayed its own)
    await until(lambda: ps[1].gateway.state.tracker.samples(("up", "m"), "buffered") == 6, 2.0)


async def test_a_wrong_password_starts_alone_and_says_why(redis_server, upstreams, proxy) -> None:
    up = await upstreams({PATH: ok})
    p = await proxy(fleet_config(redis_server, "pw", {"up": up.url}), {"FLEET_PASSWORD": "not-it"})
    assert p.gateway.fleet is not None and not p.gateway.fleet.connected
    status = (await p.get("/v1/health"))[1]["fleet"]
    assert status["state"] == "alone" and "$FLEET_PASSWORD" in status["reason"] and "not-it" not in status["reason"]
    assert ".;" not in status["reason"] and not status["reason"].endswith("."), status["reason"]  # goes on after it
    async with aiohttp.ClientSession() as session:
        assert await post(session, p) == 200


@pytest.mark.parametrize("config", [
    pytest.param({}, id="no-state-section"),
])
async def test_without_redis_there_is_no_link(config: dict[str, Any], upstreams, proxy) -> None:
    up = await upstreams({PATH: ok})
    p = await proxy({"providers": {"up": openai_provider(up.url)},
                     "routes": {"chat": {"targets": [{"provider": "up", "model": "m"}]}}, **config})
    assert p.gateway.fleet is None and p.gateway.state.listener is None
    assert (await p.get("/v1/health"))[1]["fleet"] == {"state": "off"}


async def test_a_slow_redis_costs_requests_nothing(own_redis, upstreams, proxy) -> None:
    """Redis stalls (DEBUG SLEEP): the link times out and goes alone; requests never notice."""
    import redis as sync_redis

    up = await upstreams({PATH: ok})
    ps = await fleet_of(2, proxy, fleet_config(own_redis, "slow", {"up": up.url}))
    stall = asyncio.get_running_loop().run_in_executor(None, lambda: sync_redis.Redis(
        port=own_redis.port, password=PASSWORD).execute_command("DEBUG", "SLEEP", "2"))
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as session:
        for _ in range(10):
            started = time.monotonic()
            assert await post(session, ps[0]) == 200
            assert time.monotonic() - started < 0.25  # no request waits on the stalled Redis
            await asyncio.sleep(0.1)
    await stall
    assert ps[0].gateway.fleet is not None
    await until(lambda: ps[0].gateway.fleet.connected and ps[1].gateway.fleet.connected, 8.0)
    assert ps[0].gateway.fleet.reconnects >= 1  # it went alone meanwhile, and came back


# What the link sends per call: each stream entry is an XADD here and an XREAD reply at every member,
# where each peer entry is folded, so the entries an instance sends bound the fleet's cost per call
# (docs/adr/0016, "cost per call", "one entry a tick"): in-flight counts go out on the heartbeat, not at
# each change, and the calls' samples ride the heartbeat's entry; only urgent events go before it.

LOAD_SECS = 2.5  # long enough for two heartbeats (and a third) under load
URGENT_WITHIN = 0.025  # an urgent event is sent within this long, whatever the tick


async def test_calls_share_entries_and_in_flight_counts_go_on_the_heartbeat(redis_server, upstreams,
                                                                            proxy) -> None:
    p, client, fleet = await fleet_member(redis_server, upstreams, proxy, ok)
    try:
        await asyncio.sleep(HEARTBEAT)  # the join's beat, told at once off the grid, is in
        first = (await client.xrevrange(stream_key(fleet), count=1) or [(b"0-0", {})])[0][0]
        start = time.monotonic()
        async with aiohttp.ClientSession() as session:

            async def caller() -> list[int]:  # 8 of them, each call right after the last: counts move
                return [await post(session, p) for _ in iter(lambda: time.monotonic() - start < LOAD_SECS, False)]

            statuses = [s for one in await asyncio.gather(*(caller() for _ in range(8))) for s in one]
            assert set(statuses) == {200}
        await asyncio.sleep(2 * HEARTBEAT)  # the last samples sent
        elapsed = time.monotonic() - start
        entries = await client.xrange(stream_key(fleet), min=f"({first.decode()}")
    finally:
        await client.aclose()
    events = [e for _, fields in entries for e in orjson.loads(fields[b"e"])]
    assert sum(e[0] == "s" for e in events) == len(statuses)  # every sample travels
    beats = sum(e[0] == "n" for e in events)
    assert beats <= elapsed / HEARTBEAT + 2, (beats, elapsed)  # not one per change of a count
    assert beats >= LOAD_SECS / HEARTBEAT - 1, (beats, elapsed)  # and the heartbeat goes on under load
    # the samples ride the heartbeat's entry (BATCH events at most: a busy tick's take more), and a first measure
    assert len(entries) <= elapsed / HEARTBEAT + len(events) / BATCH + 2, (len(entries), len(events), elapsed)


async def test_a_breaker_opening_does_not_wait_for_the_tick(redis_server, upstreams, proxy) -> None:
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
            assert await post(session, p) == 200  # its first measure goes at once
            async with session.post(p.url + "/v1/chat/completions", json={**CHAT, "model": "bad"}) as resp:
                assert resp.status >= 500  # the one failure opens the breaker
        await asyncio.sleep(2 * URGENT_WITHIN)
        entries = await client.xrange(stream_key(fleet))
    finally:
        await client.aclose()
    sent = [(int(entry_id.split(b"-")[0]) / 1000, e) for entry_id, fields in entries
            for e in orjson.loads(fields[b"e"])]
    (at, opening), = [(at, e) for at, e in sent if e[0] == "o"]
    opened = opening[2] - opening[3]  # its deadline less its cooldown: when it opened, wall clock
    assert at - opened < URGENT_WITHIN, at - opened  # sent at once, not on the next tick


async def test_only_a_first_measure_goes_before_the_tick(redis_server, upstreams, proxy) -> None:
    """One upstream named twice (same base_url and model: one fleet id), one name measured, the other
    never asked: the measured one's samples are no first measures and wait for the tick like any other
    (each went at once when the claims' fleet id decided, one entry per call)."""
    up = await upstreams({"/v1/chat/completions": ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    raw = fleet_config(redis_server, fleet, {"a": up.url, "b": up.url})
    raw["routes"] = {"chat": {"strategy": "fastest", "targets": [{"provider": "a", "model": "m"}]},
                     "both": {"strategy": "fastest", "targets": [{"provider": p, "model": "m"} for p in "ab"]}}
    (p,) = await fleet_of(1, proxy, raw)
    client = aioredis.Redis.from_url(redis_server.url, password=PASSWORD)
    try:
        async with aiohttp.ClientSession() as session:
            assert await post(session, p) == 200  # a's first measure (buffered)
            await asyncio.sleep(0.3)  # the measures' tick has seen a measured and b not
            first = (await client.xrevrange(stream_key(fleet), count=1))[0][0]
            start = time.monotonic()
            calls = 0
            while time.monotonic() - start < 1.0:  # one after another: each call ends before the next
                assert await post(session, p) == 200
                calls += 1
        await asyncio.sleep(2 * HEARTBEAT)
        elapsed = time.monotonic() - start
        entries = await client.xrange(stream_key(fleet), min=f"({first.decode()}")
    finally:
        await client.aclose()
    assert calls > 3 * elapsed / HEARTBEAT, calls  # the check below can tell one entry per call apart
    sent = sum(len(orjson.loads(fields[b"e"])) for _, fields in entries)  # a busy tick's take BATCH an entry
    assert len(entries) <= elapsed / HEARTBEAT + sent / BATCH + 2, (len(entries), calls, elapsed)


# What the link does while nothing needs it (docs/adr/0016, "what is per call and what is per
# second"): a route that gets no traffic here holds no measuring claim and costs Redis nothing, and a
# route asked for anew takes its claims at once.
GRACE = 0.5


async def slow(request: web.Request) -> web.StreamResponse:
    await request.read()
    await asyncio.sleep(0.6)
    return await ok(request)


async def claim_commands(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("mget", "set", "eval", "evalsha"))


async def test_a_route_without_traffic_holds_no_claim_and_costs_redis_nothing(own_redis, upstreams, proxy,
                                                                              monkeypatch) -> None:
    monkeypatch.setattr(measures, "LIVE_GRACE", GRACE, raising=False)  # the cold start's claims ahead, shortened
    a = await upstreams({"/v1/chat/completions": ok})
    b = await upstreams({"/v1/chat/completions": slow})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    raw = fleet_config(own_redis, fleet, {"a": a.url, "b": b.url})
    raw["routes"] = {"chat": {"strategy": "fastest", "targets": [{"provider": "a", "model": "m"}]},
                     "other": {"strategy": "fastest", "targets": [{"provider": "b", "model": "m"}]}}
    (p,) = await fleet_of(1, proxy, raw)
    client = aioredis.Redis.from_url(own_redis.url, password=PASSWORD)
    try:
        held = (await p.get("/v1/health"))[1]["fleet"]["measuring"]
        assert held, "a cold instance claims ahead on every route"
        async with aiohttp.ClientSession() as session:
            for _ in range(3):  # traffic on chat, buffered only: a measured in that mode
                assert await post(session, p) == 200
            await asyncio.sleep(GRACE + measures.TTL + 0.5)  # what is not renewed expires
            assert await client.keys(f"firstbyte:{fleet}:measure:*") == []
            assert (await p.get("/v1/health"))[1]["fleet"]["measuring"] == []
            before = await claim_commands(client)
            await asyncio.sleep(1.5)
            assert await claim_commands(client) - before == 0  # no MGET, no renewal: the task sleeps
            # Asked for anew: the route's claims are taken again, without waiting for a tick.
            asking = asyncio.create_task(session.post(p.url + "/v1/chat/completions", json={**CHAT, "model": "other"}))
            took = await until(lambda: any(h.startswith("buffered") for h in p.gateway.fleet.measures.status()),
                               0.5)
            assert took < 0.4, took
            async with await asking as resp:
                assert resp.status == 200
    finally:
        await client.aclose()


# What the link costs at concurrency 1 (docs/adr/0016, "one entry a tick"): calls one after another,
# each longer than the old send gap, each sent its sample as its own entry (an XADD here, an XREAD
# reply at every member, this one included): a Redis round trip per call. Samples now ride the
# heartbeat's entry, so the commands a second do not grow with the calls.

async def delayed(request: web.Request) -> web.StreamResponse:
    await request.read()
    await asyncio.sleep(0.06)  # longer than the old 50 ms send gap: each call's sample found the publisher idle
    return web.json_response(chat_body("fine"))


async def stream_commands(client: aioredis.Redis) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("xadd", "xread")}


async def test_calls_at_concurrency_one_cost_redis_per_second_not_per_call(own_redis, upstreams, proxy) -> None:
    p, client, fleet = await fleet_member(own_redis, upstreams, proxy, delayed)
    try:
        async with aiohttp.ClientSession() as session:
            assert await post(session, p) == 200  # its first measure goes at once
            await asyncio.sleep(HEARTBEAT)
            first = (await client.xrevrange(stream_key(fleet), count=1))[0][0]
            before, start, calls = await stream_commands(client), time.monotonic(), 0
            while time.monotonic() - start < 2.0:  # one at a time, as a lone client sends them
                assert await post(session, p) == 200
                calls += 1
            elapsed = time.monotonic() - start
            after = await stream_commands(client)
        await asyncio.sleep(2 * HEARTBEAT)  # the last samples sent
        entries = await client.xrange(stream_key(fleet), min=f"({first.decode()}")
    finally:
        await client.aclose()
    assert calls > 2 * (elapsed / HEARTBEAT + 2), calls  # one command per call would fail the bounds below
    sent = {c: after[c] - before[c] for c in after}
    assert sent["xadd"] <= elapsed / HEARTBEAT + 2, (sent, calls, elapsed)
    assert sent["xread"] <= elapsed / HEARTBEAT + 2, (sent, calls, elapsed)
    events = [e for _, fields in entries for e in orjson.loads(fields[b"e"])]
    assert sum(e[0] == "s" for e in events) == calls  # every sample still travels


async def test_a_stop_sends_what_waits_for_the_tick(redis_server, upstreams, proxy) -> None:
    """A deploy stops an instance between ticks: its last samples still reach the stream (the fleet's,
    and its next life's warm start), not lost with the process."""
    p, client, fleet = await fleet_member(redis_server, upstreams, proxy, ok)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(4):  # the first measure goes at once, the other three wait for the tick
                assert await post(session, p) == 200
        assert p.gateway.fleet is not None
        await p.gateway.fleet.close()  # well within the tick
        entries = await client.xrange(stream_key(fleet))
    finally:
        await client.aclose()
    events = [e for _, fields in entries for e in orjson.loads(fields[b"e"])]
    assert sum(e[0] == "s" for e in events) == 4, events


async def test_a_busy_fleet_costs_redis_per_tick_not_per_call(own_redis, upstreams, proxy) -> None:
    """Three instances under load: each writes one entry a tick (was one per 50 ms gap), and the ticks
    share the wall clock's grid, so each reader gathers a tick's entries in a reply or few (it woke
    for each entry, its own included: up to 50 times a second)."""
    up = await upstreams({"/v1/chat/completions": ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    ps = await fleet_of(3, proxy, fleet_config(own_redis, fleet, {"up": up.url}))
    client = aioredis.Redis.from_url(own_redis.url, password=PASSWORD)
    try:
        async with aiohttp.ClientSession() as session:
            for p in ps:
                assert await post(session, p) == 200
            await asyncio.sleep(HEARTBEAT)
            before, start = await stream_commands(client), time.monotonic()
            turn = itertools.count()

            async def caller() -> int:  # round-robin over the three, each call right after the last
                calls = 0
                while time.monotonic() - start < 2.5:
                    assert await post(session, ps[next(turn) % 3]) == 200
                    calls += 1
                return calls

            calls = sum(await asyncio.gather(*(caller() for _ in range(6))))
            elapsed = time.monotonic() - start
            after = await stream_commands(client)
    finally:
        await client.aclose()
    ticks = elapsed / HEARTBEAT + 2
    sent = {c: after[c] - before[c] for c in after}
    assert calls > 2 * 3 * 3 * ticks, calls  # one command per call would fail the bounds twice over
    assert sent["xadd"] <= 3 * ticks + calls / BATCH, (sent, calls, elapsed)  # a busy tick's samples: BATCH an entry
    assert sent["xread"] <= 3 * 3 * ticks, (sent, calls, elapsed)


async def test_an_idle_instance_writes_one_entry_a_tick(own_redis, upstreams, proxy) -> None:
    """The heartbeat's timer may fire a little before the tick; that beat is the tick's, not a reason
    for another a few milliseconds later (two entries, two reads, where one does)."""
    up = await upstreams({"/v1/chat/completions": ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    await fleet_of(1, proxy, fleet_config(own_redis, fleet, {"up": up.url}))
    client = aioredis.Redis.from_url(own_redis.url, password=PASSWORD)
    try:
        await asyncio.sleep(6 * HEARTBEAT)
        entries = await client.xrange(stream_key(fleet))
    finally:
        await client.aclose()
    times = [int(entry_id.split(b"-")[0]) / 1000 for entry_id, _ in entries][1:]  # the join's beat is extra
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps and min(gaps) > HEARTBEAT / 2, gaps


@pytest.mark.parametrize(("now", "tick", "after"), [
    pytest.param(9.999, 10.0, 11.0, id="a-timer-a-millisecond-early-serves-the-tick"),
    pytest.param(10.0, 10.0, 11.0, id="on-time"),
    pytest.param(10.4, 10.0, 11.0, id="late"),
    pytest.param(12.3, 10.0, 13.0, id="late-by-more-than-a-tick"),
    pytest.param(9.9, 10.0, None, id="an-urgent-send-before-the-tick"),
])
def test_the_tick_a_send_serves(now: float, tick: float, after: float | None) -> None:
    assert HEARTBEAT == 1.0
    assert served(now, tick) == after


async def test_a_warm_start_reads_back_a_bounded_amount_of_a_busy_stream(redis_server, upstreams, proxy,
                                                                         monkeypatch) -> None:
    """One entry a tick carries a busy second's events (up to BATCH): 5,000 entries of 500 samples were
    250 MB that Redis could not send within the command's timeout (the instance never joined), of 100
    samples 500,000 events folded for ~9 s before the instance was ready. The warm start reads the
    stream's newest WARM_BYTES back, whatever its entries hold, and folds them oldest first."""
    monkeypatch.setattr(backlog, "WARM_BYTES", 50_000, raising=False)  # before the bound: fails on the count
    up = await upstreams({"/v1/chat/completions": ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    raw = fleet_config(redis_server, fleet, {"up": up.url})
    (fid,) = fleet_ids(make_config(raw, ENV)).values()
    client = aioredis.Redis.from_url(redis_server.url, password=PASSWORD)
    try:
        now, ids = time.time(), []
        for n in range(200):  # a busy peer's ticks, 100 samples each (~7 KB), the newest last at 0.5 s
            secs = 0.5 if n == 199 else 2.0
            wires = [["s", fid, "buffered", secs, now - 200 + n] for _ in range(100)]
            ids.append(await client.xadd(stream_key(fleet), {"i": "peer", "e": orjson.dumps(wires)}))
    finally:
        await client.aclose()
    (p,) = await fleet_of(1, proxy, raw)
    fleet_link = p.gateway.fleet
    assert fleet_link is not None
    assert 100 <= fleet_link.events_in <= 1_000, fleet_link.events_in  # ~7 entries' worth, not 20,000 events
    newest = tuple(map(int, ids[-1].decode().split("-")))
    assert tuple(map(int, fleet_link.last_id.split("-"))) >= newest  # the reader goes on from the newest
    assert p.gateway.state.recent(("up", "m"), "buffered")[-1] == 0.5  # the newest entry folded last


async def test_a_catch_up_after_a_drop_leaves_the_loop_free_and_is_bounded(own_redis, upstreams, proxy) -> None:
    """After a dropped link the reader caught up with XREAD count=512: a busy fleet's backlog (here 1,000
    entries of 500 samples, 150,000 events) folded them all in one pass, the loop held for a second or
    more (requests, /healthz, the deadline sweeper all waiting). Now the catch-up reads the newest
    WARM_BYTES back, like the warm start, and folds them a slice at a time."""
    up = await upstreams({PATH: ok})
    raw = fleet_config(own_redis, "backlog", {"up": up.url})
    (fid,) = fleet_ids(make_config(raw, ENV)).values()
    (p,) = await fleet_of(1, proxy, raw)
    fleet_link = p.gateway.fleet
    admin = aioredis.Redis.from_url(own_redis.url, password=PASSWORD)
    try:
        # The link drops and cannot come back (its password no longer works) while a peer writes on.
        await admin.config_set("requirepass", "not-the-fleet's")
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await until(lambda: not fleet_link.connected, 3.0)
        before, now = fleet_link.events_in, time.time()
        async with admin.pipeline(transaction=False) as pipe:
            for n in range(300):  # a busy peer's ticks, 500 samples each (~35 KB), the newest last at 0.5 s
                secs = 0.5 if n == 299 else 2.0
                pipe.xadd(stream_key("backlog"), {"i": "peer", "e": orjson.dumps(
                    [["s", fid, "buffered", secs, now - 10 + n / 100] for _ in range(500)])})
            await pipe.execute()
        answered: list[float] = []  # from one /healthz call's answer to the next's, 5 ms apart, while catching up

        async def watch() -> None:
            async with aiohttp.ClientSession() as session:
                last = time.monotonic()
                while True:
                    await asyncio.sleep(0.005)
                    async with session.get(p.url + "/healthz") as resp:
                        assert resp.status == 200
                    answered.append(time.monotonic() - last)
                    last = time.monotonic()

        watcher = asyncio.create_task(watch())
        try:
            await admin.config_set("requirepass", PASSWORD)
            await until(lambda: list(p.gateway.state.recent(("up", "m"), "buffered"))[-1:] == [0.5], 10.0)
            await asyncio.sleep(0.05)  # the watcher's call held by the last pass is answered, and counted
        finally:
            watcher.cancel()
    finally:
        await admin.aclose()
    # the loop was held 1.5 s or more before (150,000 events in one pass); slices of ~10-100 ms now (a loaded box)
    assert len(answered) > 10 and max(answered) < 0.5, sorted(answered)[-5:]
    assert fleet_link.events_in - before <= 30_000, fleet_link.events_in - before  # the newest 2 MB, not 150,000


async def test_a_peers_success_older_than_the_failures_closes_nothing(redis_server, upstreams, proxy) -> None:
    """A peer's routine sample waits for its tick (up to a second), so a success it took before the
    target began failing reached the others after the failures that opened the breaker there, and
    closed it: the fleet went back to the failing target (issue 26, leader-fails). A success older
    than the newest failure a breaker knows still counts as a sample, and closes nothing."""
    failing = [False]

    async def flaky(request: web.Request) -> web.StreamResponse:
        return await (status_handler(503) if failing[0] else ok)(request)

    bad = await upstreams({PATH: flaky})
    good = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    ps = await fleet_of(2, proxy, fleet_config(redis_server, fleet, {"bad": bad.url, "good": good.url}))
    key = ("bad", "m")
    async with aiohttp.ClientSession() as session:
        assert await post(session, ps[0]) == 200  # its first measure goes at once
        await asyncio.sleep(0.2)
        while time.time() % HEARTBEAT > 0.3 * HEARTBEAT:  # early in a tick: the next success waits for it
            await asyncio.sleep(0.01)
        assert await post(session, ps[0]) == 200  # a success of bad, sent on the next tick
        failing[0] = True
        for _ in range(3):  # the threshold's failures (failed over to good): bad opens on both
            assert await post(session, ps[1]) == 200
        await until(lambda: all(not p.gateway.state.health(key, p.gateway.clock()).usable for p in ps), 0.5)
        await asyncio.sleep(1.5 * HEARTBEAT)  # the tick brought ps[0]'s older success to ps[1]
    assert ps[1].gateway.state.tracker.samples(key, "buffered") == 2  # heard as a sample
    for p in ps:
        assert p.gateway.state.health(key, p.gateway.clock()).state == "open"


async def test_a_peers_failures_are_dated_by_their_stream_entry(redis_server, upstreams, proxy) -> None:
    """A failure carries no time on the wire; its entry's id does. Undated, a peer's success older than
    the failures heard (it rode the peer's next tick) reset their count; dated when folded, a warm
    start's old failures would outlive the success its backlog brings after them."""
    up = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    raw = fleet_config(redis_server, fleet, {"up": up.url}, failures=5)
    (fid,) = fleet_ids(make_config(raw, ENV)).values()
    fail, stream = ["f", fid, "503", 5, 30.0], stream_key(fleet)
    client = aioredis.Redis.from_url(redis_server.url, password=PASSWORD)
    try:
        ms = int(time.time() * 1000)  # a backlog 10 s old: two failures, then a success taken after them
        await client.xadd(stream, {"i": "peer", "e": orjson.dumps([fail, fail])}, id=f"{ms - 10_000}-0")
        await client.xadd(stream, {"i": "peer", "e": orjson.dumps([["s", fid, "buffered", 0.2, ms / 1000 - 9.5]])},
                          id=f"{ms - 9_000}-0")
        (p,) = await fleet_of(1, proxy, raw)
        target = p.gateway.state.target(("up", "m"))
        assert (p.gateway.state.tracker.samples(("up", "m"), "buffered"), target.breaker.failures) == (1, 0)
        await client.xadd(stream, {"i": "peer", "e": orjson.dumps([fail, fail])})  # now: two failures, then
        await client.xadd(stream, {"i": "peer", "e": orjson.dumps([["s", fid, "buffered", 0.2, time.time() - 0.5]])})
        await until(lambda: p.gateway.state.tracker.samples(("up", "m"), "buffered") == 2)  # an older success
    finally:
        await client.aclose()
    assert target.breaker.failures == 2


async def test_one_entry_of_a_hundred_thousand_events_does_not_hold_the_loop(redis_server, upstreams, proxy) -> None:
    """A peer writes at most BATCH events an entry, but anything that can write the stream can write
    more, and one entry is folded in one pass: 100,000 samples (7 MB) held /healthz 1.2 s. The reader
    drops an entry past a megabyte unread, and keeps another's first BATCH events."""
    up = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    raw = fleet_config(redis_server, fleet, {"up": up.url})
    (fid,) = fleet_ids(make_config(raw, ENV)).values()
    (p,) = await fleet_of(1, proxy, raw)
    before = p.gateway.fleet.events_in
    client = aioredis.Redis.from_url(redis_server.url, password=PASSWORD)
    answered: list[float] = []
    try:
        async with aiohttp.ClientSession() as session:
            for n in (100_000, 12_000):  # 7 MB: dropped unread; 0.85 MB: its first BATCH kept
                events = orjson.dumps([["s", fid, "buffered", 0.2, time.time()] for _ in range(n)])
                await client.xadd(stream_key(fleet), {"i": "peer", "e": events})
            start = time.monotonic()
            while time.monotonic() - start < 1.5:
                began = time.monotonic()
                async with session.get(p.url + "/healthz") as resp:
                    assert resp.status == 200
                answered.append(time.monotonic() - began)
                await asyncio.sleep(0.005)
    finally:
        await client.aclose()
    assert p.gateway.fleet.events_in - before == BATCH
    assert max(answered) < 0.3, sorted(answered)[-3:]


async def test_a_first_measure_goes_at_once_and_the_samples_after_it_wait_for_the_tick(redis_server, upstreams,
                                                                                        proxy) -> None:
    """A cold fleet's first sample of a target goes at once; the next ones are routine. The link read
    "still unmeasured" from the measuring claims' last tick, up to 0.5 s old once the claims stood
    still (an idle fleet before its first request), so every call of a cold start's first half
    second wrote its own entry and woke every reader (scripts/fleet_pool.py cold-start: 0.16 XADD per
    call, against 0.006 under steady load)."""
    p, client, fleet = await fleet_member(redis_server, upstreams, proxy, ok, "fastest")
    try:
        await asyncio.sleep(1.5 * measures.QUIET_SECS)  # idle: the claims' tick is the quiet one
        newest = await client.xrevrange(stream_key(fleet), count=1)
        first = newest[0][0].decode() if newest else "0-0"
        async with aiohttp.ClientSession() as session:
            start, calls = time.monotonic(), 0
            while time.monotonic() - start < 0.4:  # one after another, right from the first measure
                assert await post(session, p) == 200
                calls += 1
        elapsed = time.monotonic() - start
        entries = await client.xrange(stream_key(fleet), min=f"({first}")
    finally:
        await client.aclose()
    assert calls > 8, calls  # one entry per call would fail the bound below
    sent = [e for _, fields in entries for e in orjson.loads(fields[b"e"])]
    samples = [e for e in sent if e[0] == "s"]
    assert samples[0][3] > 0  # the first measure went (at once)
    # a busy tick's samples take BATCH an entry (a fast box makes ~2,000 calls a second here)
    assert len(entries) <= elapsed / HEARTBEAT + len(sent) / BATCH + 2, (len(entries), calls, elapsed)


async def either(request: web.Request) -> web.StreamResponse:
    """A stream when asked for one, else one body."""
    if not (await request.json()).get("stream"):
        return web.json_response(chat_body("fine"))
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk_event("fine") + chunk_event("", "stop") + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def mget_calls(client: aioredis.Redis) -> int:
    return int((await client.info("commandstats")).get("cmdstat_mget", {}).get("calls", 0))


async def streamed(session: aiohttp.ClientSession, p: Proxy) -> int:
    async with session.post(p.url + PATH, json={**CHAT, "stream": True}) as resp:
        await resp.read()
        return resp.status


async def test_a_mode_nobody_asked_for_keeps_the_quiet_pace_in_the_cold_start(own_redis, upstreams, proxy) -> None:
    """During the cold start every mode holds a claim ahead, but only a mode asked for here needs the
    claims read every 50 ms: a fleet asked only for streams read the buffered claims 20 times a second
    for a second after each change (scripts/fleet_pool.py cold-start and leader-fails: 0.10-0.14 MGET
    per call), where the quiet pace is 2 a second; a request of that mode wakes the reads at once."""
    p, client, fleet = await fleet_member(own_redis, upstreams, proxy, either, "fastest")
    try:
        await asyncio.sleep(1.5 * measures.QUIET_SECS)  # idle: the claims stood still
        async with aiohttp.ClientSession() as session:
            assert await streamed(session, p) == 200  # streamed measured; buffered still claimed ahead
            await asyncio.sleep(0.1)
            before, start = await mget_calls(client), time.monotonic()
            while time.monotonic() - start < 1.0:  # streams only, as fleet_pool's scenarios send
                assert await streamed(session, p) == 200
            elapsed = time.monotonic() - start
            mgets = await mget_calls(client) - before
            assert p.gateway.fleet is not None and any(m == "buffered" for _, m in p.gateway.fleet.measures.held)
    finally:
        await client.aclose()
    assert mgets <= elapsed / measures.QUIET_TICK + 2, (mgets, elapsed)


async def test_failures_after_the_breaker_opened_wait_for_the_tick(redis_server, upstreams, proxy) -> None:
    """A counted failure goes at once while the breaker counts: the fleet opens at its threshold. Once it
    is open here (and its opening went at once), the calls still in flight that fail add nothing a peer
    needs now, yet each wrote its own entry and woke every reader (leader-fails: 0.09 XADD per call)."""
    delays = iter([0.0, 0.1, 0.15, 0.2, 0.25, 0.3])

    async def failing_late(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(next(delays))
        return web.json_response({"error": {"message": "down"}}, status=503)

    bad = await upstreams({PATH: failing_late})
    good = await upstreams({PATH: ok})
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    (p,) = await fleet_of(1, proxy, fleet_config(redis_server, fleet, {"bad": bad.url, "good": good.url},
                                                 failures=1))
    client = aioredis.Redis.from_url(redis_server.url, password=PASSWORD)
    try:
        await asyncio.sleep(0.2)
        newest = await client.xrevrange(stream_key(fleet), count=1)
        first = newest[0][0].decode() if newest else "0-0"
        start = time.monotonic()
        async with aiohttp.ClientSession() as session:  # six calls in flight; the first failure opens
            assert await asyncio.gather(*(post(session, p) for _ in range(6))) == [200] * 6
        elapsed = time.monotonic() - start
        entries = await client.xrange(stream_key(fleet), min=f"({first}")
        await asyncio.sleep(1.5 * HEARTBEAT)
        later = await client.xrange(stream_key(fleet), min=f"({first}")
    finally:
        await client.aclose()
    sent = [e for _, fields in later for e in orjson.loads(fields[b"e"])]
    assert sum(e[0] == "f" for e in sent) == 6  # every failure still travels
    assert sum(e[0] == "o" for e in sent) == 1
    # the opening, good's first measure (the failovers'), the ticks: not one entry per later failure (7 before)
    assert len(entries) <= elapsed / HEARTBEAT + 3, (len(entries), elapsed)


async def test_a_peers_entry_is_folded_a_slice_at_a_time_with_the_loop_served_between(
        redis_server, upstreams, proxy) -> None:
    """A tick's entry holds up to a second of a peer's samples (BATCH events), and every member folds
    its peers' entries of one tick at the same instant. Folded in one pass, an entry held the loop with
    every call in flight waiting: on cold-start the fleet's calls that ended within 60 ms after the tick
    read ~3.5 ms slower (docs/operations.md, "The cold start, call by call"). A task that looks at
    every turn of the loop while the reader folds one entry sees it part-folded (it saw 0, then all)."""
    p, client, fleet = await fleet_member(redis_server, upstreams, proxy, ok)
    try:
        assert p.gateway.fleet is not None
        ((key, fid),) = p.gateway.fleet.fid_of.items()
        tracker, seen, stop = p.gateway.state.tracker, set(), asyncio.Event()

        async def look() -> None:
            while not stop.is_set():
                seen.add(tracker.samples(key, "buffered"))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(look())
        await client.xadd(stream_key(fleet), {"i": "peer", "e": orjson.dumps(
            [["s", fid, "buffered", 0.05, time.time() - 0.5] for _ in range(BATCH)])})
        await until(lambda: tracker.samples(key, "buffered") == BATCH, 3.0)
        stop.set()
        await watcher
    finally:
        await client.aclose()
    assert seen & set(range(1, BATCH)), sorted(seen)  # a count between none and all: folded in slices


async def test_a_link_dropped_mid_entry_folds_the_rest_of_that_entry_when_it_is_back(
        redis_server, upstreams, proxy) -> None:
    """An entry is folded a slice at a time, so the reader's task can end in a pause between two slices (a
    drop: ``_serve`` cancels its tasks; here ``close``). The entry's id was taken as read when its fold
    began, so the catch-up after the drop began after it and the rest of the entry (up to a second of a
    peer's samples, a breaker's opening among them) was never folded. Now the catch-up reads that entry
    again and folds only what it had not: every event once."""
    p, client, fleet = await fleet_member(redis_server, upstreams, proxy, ok)
    try:
        link = p.gateway.fleet
        assert link is not None
        ((key, fid),) = link.fid_of.items()
        tracker = p.gateway.state.tracker

        async def drop_mid_entry() -> int:
            while not 0 < tracker.samples(key, "buffered") < BATCH:
                await asyncio.sleep(0)
            await link.close()  # lands in the reader's pause between two slices of the entry
            return tracker.samples(key, "buffered")

        dropper = asyncio.create_task(drop_mid_entry())
        await client.xadd(stream_key(fleet), {"i": "peer", "e": orjson.dumps(
            [["s", fid, "buffered", 0.05, time.time() - 0.5] for _ in range(BATCH)])})
        cut = await asyncio.wait_for(dropper, 3.0)
        assert 0 < cut < BATCH, cut  # the drop came mid-entry
        await link.start()  # back: connects and catches up from the last entry it read
        await until(lambda: link.connected, 3.0)
        await until(lambda: tracker.samples(key, "buffered") >= BATCH, 3.0)
        await asyncio.sleep(0.2)  # anything folded twice would have come by now
    finally:
        await client.aclose()
    assert tracker.samples(key, "buffered") == BATCH
