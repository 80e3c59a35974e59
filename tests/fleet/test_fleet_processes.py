"""A fleet as deployed: real ``firstbyte serve`` processes over loopback, one real redis-server,
fake upstreams in the test's process. Everything is read from outside: /v1/health, the upstream's
call counts, the process's log."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp

from proxy.fleet.link import HEARTBEAT

from ..conftest import until
from .conftest import PATH, ROOT, Instance, answering, call, config, target


async def test_a_breaker_opened_in_one_process_excludes_in_the_others_within_100ms(
        redis_server, upstreams, instances) -> None:
    _, bad = answering(status=503)
    _, good = answering()
    urls = {"bad": (await upstreams({PATH: bad})).url, "good": (await upstreams({PATH: good})).url}
    fleet = f"p-{uuid.uuid4().hex[:8]}"
    fleet_ = [await instances(config(redis_server, fleet, urls, failures=1)) for _ in range(3)]
    async with aiohttp.ClientSession() as session:
        for inst in fleet_:
            assert (await inst.health(session))["fleet"]["state"] == "in-fleet"
        assert await call(session, fleet_[0]) == 200  # bad failed once: open there
        opened = time.monotonic()
        for inst in fleet_[1:]:
            while target(await inst.health(session), "bad")["breaker"] == "closed":
                assert time.monotonic() - opened < 0.1, "not excluded within 100 ms"
                await asyncio.sleep(0.003)


async def test_a_cold_fleet_measures_each_target_once(redis_server, upstreams, instances) -> None:
    fast_calls, fast = answering(0.01)
    slow_calls, slow = answering(0.08)
    urls = {"slow": (await upstreams({PATH: slow})).url, "fast": (await upstreams({PATH: fast})).url}
    fleet = f"p-{uuid.uuid4().hex[:8]}"
    fleet_ = [await instances(config(redis_server, fleet, urls, strategy="fastest")) for _ in range(3)]
    async with aiohttp.ClientSession() as session:
        for inst in fleet_ * 3:  # round robin, a client's pace
            assert await call(session, inst) == 200
            await asyncio.sleep(0.05)
    assert len(slow_calls) == 1  # measured once for the fleet (alone, each instance measured it: 3)
    assert len(fast_calls) == 8


async def test_a_restarted_instance_starts_warm(redis_server, upstreams, instances) -> None:
    _, ok = answering()
    urls = {"up": (await upstreams({PATH: ok})).url}
    fleet = f"p-{uuid.uuid4().hex[:8]}"
    first = await instances(config(redis_server, fleet, urls))
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            assert await call(session, first) == 200
        await asyncio.sleep(HEARTBEAT + 0.1)  # the samples ride the next tick's entry
        metrics = await first.metrics(session)
        name = (await first.health(session))["fleet"]["instance"]
        first.stop()
        sent = next(ln for ln in metrics.splitlines() if ln.startswith('firstbyte_fleet_events_total{direction="out"}'))
        assert "firstbyte_fleet_connected 1" in metrics and float(sent.split()[-1]) >= 3  # 3 samples, in-flight counts
        served = [ln for ln in first.access_log.read_text().splitlines() if "path=/v1/chat/completions" in ln]
        assert len(served) == 3 and all(f" instance={name} " in ln for ln in served)  # which instance served
        again = await instances(config(redis_server, fleet, urls))
        health = await again.health(session)  # the first look after /readyz said ready
    assert target(health, "up")["buffered"]["samples"] == 3 and health["fleet"]["state"] == "in-fleet"


async def test_a_wrong_password_starts_alone_and_says_why(redis_server, upstreams, instances) -> None:
    _, ok = answering()
    urls = {"up": (await upstreams({PATH: ok})).url}
    inst = await instances(config(redis_server, "pw", urls), password="wrong")
    async with aiohttp.ClientSession() as session:
        health = await inst.health(session)
        assert await call(session, inst) == 200
    explained = subprocess.run([sys.executable, "-m", "proxy.cli", "explain", "chat", "--url", inst.url],
                               capture_output=True, text=True, cwd=ROOT, timeout=30)
    log = inst.stop()
    assert "fleet=pw alone since " in explained.stdout and "$FLEET_PASSWORD" in explained.stdout
    assert health["fleet"]["state"] == "alone" and "$FLEET_PASSWORD" in health["fleet"]["reason"]
    assert "refused the password ($FLEET_PASSWORD)" in log and "wrong" not in log.split("refused")[1][:80]


async def test_redis_killed_mid_load_loses_no_request_and_the_fleet_rejoins(own_redis, upstreams, instances) -> None:
    _, ok = answering(0.005)
    urls = {"up": (await upstreams({PATH: ok})).url}
    fleet_ = [await instances(config(own_redis, "kill", urls)) for _ in range(2)]
    statuses: list[int] = []

    async def client(session: aiohttp.ClientSession, n: int) -> None:
        for i in range(n):
            statuses.append(await call(session, fleet_[i % 2]))

    async with aiohttp.ClientSession() as session:
        load = asyncio.gather(*(client(session, 60) for _ in range(4)))
        await asyncio.sleep(0.3)
        own_redis.kill()  # mid-load
        await load
        assert statuses == [200] * 240  # nobody waited on Redis, nobody failed for it
        for inst in fleet_:
            assert (await inst.health(session))["fleet"]["state"] == "alone"
        own_redis.start()
        for inst in fleet_:
            deadline = time.monotonic() + 10
            while (await inst.health(session))["fleet"]["state"] != "in-fleet":
                assert time.monotonic() < deadline, "no rejoin within 10 s"
                await asyncio.sleep(0.05)
    logs = [inst.stop() for inst in fleet_]
    for log in logs:  # one line per change: joined, alone, joined again; no line per request or retry
        assert log.count("carrying on alone") == 1 and log.count("joined as") == 2


async def _last(session: aiohttp.ClientSession, inst: Instance, name: str, part: str, by: str) -> dict[str, Any]:
    """The target's last change of ``part`` on ``inst`` once it names ``by`` (waiting at most 2 s)."""
    deadline = time.monotonic() + 2
    while True:
        seen = target(await inst.health(session), name)["last"][part]
        if seen is not None and seen["by"] == by:
            return seen  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"{part} of {name} still {seen}, not by {by}"
        await asyncio.sleep(0.01)


def _wall(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


async def test_health_and_explain_say_which_instance_saw_what_last(redis_server, upstreams, instances) -> None:
    _, bad = answering(status=503)
    _, good = answering()
    urls = {"bad": (await upstreams({PATH: bad})).url, "good": (await upstreams({PATH: good})).url}
    fleet = f"p-{uuid.uuid4().hex[:8]}"
    a, b = [await instances(config(redis_server, fleet, urls, failures=1)) for _ in range(2)]
    async with aiohttp.ClientSession() as session:
        name_a, name_b = [(await i.health(session))["fleet"]["instance"] for i in (a, b)]
        before = time.time()
        assert await call(session, a) == 200  # on a: bad fails once (opened), good answers (its figure)
        after = time.time()
        figure = await _last(session, b, "good", "figure", name_a)  # b says a measured good, and when
        breaker = await _last(session, b, "bad", "breaker", name_a)
        assert figure["what"] == "buffered sample" and breaker["what"] == "opened"
        for seen in (figure, breaker):  # the wall clock of a's event (same box: no skew; ms stamps)
            assert before - 0.01 <= _wall(seen["at"]) <= after + 0.01, (seen, before, after)
        assert await call(session, b) == 200  # b serves good now: a says so
        assert (await _last(session, a, "good", "figure", name_b))["what"] == "buffered sample"
        own = target(await a.health(session), "bad")["last"]["breaker"]
    explained = subprocess.run([sys.executable, "-m", "proxy.cli", "explain", "chat", "--url", a.url],
                               capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert own["by"] == name_a  # a's own event, named as its access log names a
    # the access log writes what gathered every FLUSH_SECS: explain may answer before a's line is out
    await until(lambda: f" instance={name_a} " in a.access_log.read_text(), 2.0)
    assert f" instance={name_a} " in a.access_log.read_text()
    assert f"last good: figure buffered sample by {name_b} at " in explained.stdout
    said = explained.stdout.split(f"last bad: breaker opened by {name_a} at ")[1].split()[0]
    assert abs(_wall(said) - _wall(own["at"])) < 0.005  # the same event (ms stamps read twice from two clocks)
