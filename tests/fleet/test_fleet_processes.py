"""A fleet as deployed: real ``firstbyte serve`` processes over loopback, one real redis-server,
fake upstreams in the test's process. Everything is read from outside: /v1/health, the upstream's
call counts, the process's log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from ..conftest import chat_body, status_handler
from ..redis_server import PASSWORD, RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
PATH = "/v1/chat/completions"


class Instance:
    """One ``firstbyte serve`` with its own routes file and log."""

    def __init__(self, tmp: Path, config: dict[str, Any], password: str = PASSWORD) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = tmp / uuid.uuid4().hex[:6]
        self.dir.mkdir()
        self.access_log = self.dir / "access.log"
        (self.dir / "routes.json").write_bytes(orjson.dumps({**config, "listen": f"127.0.0.1:{self.port}",
                                                             "access_log": {"path": str(self.access_log)}}))
        self.log = self.dir / "firstbyte.log"
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> Instance:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; from proxy.cli import main; sys.exit(main())",
                 "serve", "--config", str(self.dir / "routes.json")],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "FLEET_PASSWORD": self.password})
        async with aiohttp.ClientSession() as session:
            for _ in range(400):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.url + "/readyz") as resp:
                        if resp.status == 200:
                            return self
                assert self.proc.poll() is None, self.log.read_text()
                await asyncio.sleep(0.025)
        raise AssertionError("firstbyte never became ready")

    async def metrics(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.url + "/metrics") as resp:
            return await resp.text()

    async def health(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(self.url + "/v1/health") as resp:
            return await resp.json()  # type: ignore[no-any-return]

    def stop(self) -> str:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text(errors="replace")


@pytest.fixture
async def instances(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    started: list[Instance] = []

    async def start(config: dict[str, Any], password: str = PASSWORD) -> Instance:
        inst = await Instance(tmp_path, config, password).start()
        started.append(inst)
        return inst

    yield start
    for inst in started:
        inst.stop()


def config(redis: RedisServer, fleet: str, urls: dict[str, str], strategy: str = "ordered",
           failures: int = 3) -> dict[str, Any]:
    return {
        "state": {"redis": redis.url, "fleet": fleet, "password_env": "FLEET_PASSWORD"},
        "shutdown_grace": 1,
        "providers": {n: {"kind": "openai", "base_url": u + "/v1", "timeouts": {"connect": 1, "first_chunk": 2}}
                      for n, u in urls.items()},
        "routes": {"chat": {"strategy": strategy, "cooldown": {"failures": failures, "secs": 30},
                            "fastest": {"explore": 0},
                            "targets": [{"provider": n, "model": "m"} for n in urls]}},
    }


def answering(delay: float = 0.0, status: int = 200) -> tuple[list[int], Any]:
    calls: list[int] = []
    fail = status_handler(status)

    async def handle(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        await request.read()
        await asyncio.sleep(delay)
        return web.json_response(chat_body("ok")) if status == 200 else await fail(request)

    return calls, handle


async def call(session: aiohttp.ClientSession, inst: Instance) -> int:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with session.post(inst.url + PATH, json=body) as resp:
        await resp.read()
        return resp.status


def target(health: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in health["targets"] if t["target"] == name)


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
        await asyncio.sleep(0.1)
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
