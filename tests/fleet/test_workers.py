"""``workers: 2``: one ``firstbyte serve`` that is a supervisor of two worker processes on one port,
read from outside like any deployment: /v1/health says which worker answered, the upstream's call
counts, /metrics, the process's log, its signals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from ..redis_server import RedisServer
from ..test_contrib import promtool
from .test_fleet_processes import PATH, ROOT, Instance, answering, call, config, target


class Box(Instance):
    """A supervised box: ready when the supervisor says every worker listens."""

    async def start(self) -> Box:  # type: ignore[override]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "proxy.cli", "serve", "--config", str(self.dir / "routes.json")],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "FLEET_PASSWORD": self.password})
        deadline = time.monotonic() + 40  # two interpreters importing firstbyte on a busy machine
        while "workers listening on" not in self.log.read_text(errors="replace"):
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            await asyncio.sleep(0.05)
        return self

    def rewrite(self, change: dict[str, Any]) -> None:
        path = self.dir / "routes.json"
        path.write_bytes(orjson.dumps({**orjson.loads(path.read_bytes()), **change}))


pytestmark = pytest.mark.timeout(150)  # each box starts three interpreters


def box_config(redis: RedisServer, urls: dict[str, str], failures: int = 3, workers: int = 2) -> dict[str, Any]:
    return {**config(redis, f"w-{uuid.uuid4().hex[:8]}", urls, failures=failures), "workers": workers}


@pytest.fixture
async def boxes(tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[Box] = []

    async def start(cfg: dict[str, Any]) -> Box:
        box = await Box(tmp_path, cfg).start()
        started.append(box)
        return box

    yield start
    for box in started:
        box.stop()


async def fresh(box: Box, path: str) -> tuple[int, Any]:
    """One request on a new connection (the kernel picks the worker anew for each)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session, \
            session.get(box.url + path) as resp:
        body = await resp.read()
        return resp.status, (orjson.loads(body) if path == "/v1/health" else body.decode())


async def workers_seen(box: Box, tries: int = 40) -> set[int]:
    seen = set()
    for _ in range(tries):
        status, health = await fresh(box, "/v1/health")
        assert status == 200 and health["box"]["workers"] == 2
        seen.add(health["box"]["worker"])
    return seen


async def test_two_workers_answer_on_one_port_and_both_take_connections(redis_server, upstreams, boxes) -> None:
    _, ok = answering()
    box = await boxes(box_config(redis_server, {"up": (await upstreams({PATH: ok})).url}))
    assert await workers_seen(box) == {0, 1}
    async with aiohttp.ClientSession() as session:
        assert await call(session, box) == 200


async def test_a_breaker_opened_through_one_worker_excludes_the_target_on_the_other(
        redis_server, upstreams, boxes) -> None:
    bad_calls, bad = answering(status=503)
    _, good = answering()
    urls = {"bad": (await upstreams({PATH: bad})).url, "good": (await upstreams({PATH: good})).url}
    box = await boxes(box_config(redis_server, urls, failures=1))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        assert await call(session, box) == 200  # bad failed once: its breaker opens, good answers
        await asyncio.sleep(0.2)
        for _ in range(20):  # each on a new connection: both workers among them
            assert await call(session, box) == 200
    assert len(bad_calls) == 1  # no worker tried the open target again
    for _ in range(10):
        _, health = await fresh(box, "/v1/health")
        assert target(health, "bad")["breaker"] == "open"


def totals(text: str) -> dict[str, float]:
    """The counters of a scrape (``*_total`` samples and histogram counts) by series."""
    out = {}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if not line.startswith("#") and (series.split("{")[0].endswith(("_total", "_count"))):
            out[series] = float(value)
    return out


async def test_metrics_read_twenty_times_give_the_same_totals_whichever_worker_answers(
        redis_server, upstreams, boxes) -> None:
    _, ok = answering()
    box = await boxes(box_config(redis_server, {"up": (await upstreams({PATH: ok})).url}))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for _ in range(12):
            assert await call(session, box) == 200
    await asyncio.sleep(0.5)  # the observers' batches are written
    scrapes = [(await fresh(box, "/metrics"))[1] for _ in range(20)]
    first = totals(scrapes[0])
    served = sum(v for k, v in first.items() if k.startswith("firstbyte_requests_total"))
    assert served == 12
    assert all(totals(s) == first for s in scrapes)
    checked = subprocess.run([promtool(), "check", "metrics"], input=scrapes[-1], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
