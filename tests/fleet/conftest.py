"""Helpers of the fleet's process tests (test_fleet_processes, test_workers): real ``firstbyte serve``
processes over loopback, their config, and fake upstreams that count calls."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
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

from ..conftest import chat_body, status_handler, stop_process
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
        return stop_process(self.proc, self.log)


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
                            "fastest": {"explore": 0}, "hedge": False,  # the calls the unraced walk makes
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


class Box(Instance):
    """A supervised box: ready when the supervisor says every worker listens."""

    env: dict[str, str] = {}  # a test's extra environment (systemd's), set before start

    async def start(self) -> Box:  # type: ignore[override]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "proxy.cli", "serve", "--config", str(self.dir / "routes.json")],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "FLEET_PASSWORD": self.password, **self.env})
        deadline = time.monotonic() + 40  # two interpreters importing firstbyte on a busy machine
        while "workers listening on" not in self.log.read_text(errors="replace"):
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            await asyncio.sleep(0.05)
        return self

    def rewrite(self, change: dict[str, Any]) -> None:
        path = self.dir / "routes.json"
        path.write_bytes(orjson.dumps({**orjson.loads(path.read_bytes()), **change}))


def box_config(redis: RedisServer, urls: dict[str, str], failures: int = 3, workers: int = 2) -> dict[str, Any]:
    return {**config(redis, f"w-{uuid.uuid4().hex[:8]}", urls, failures=failures), "workers": workers}


@pytest.fixture
async def boxes(tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[Box] = []

    async def start(cfg: dict[str, Any]) -> Box:
        box = Box(tmp_path, cfg)
        started.append(box)  # stopped even when it never says ready
        return await box.start()

    yield start
    for box in started:
        box.stop()


async def fresh(box: Box, path: str) -> tuple[int, Any]:
    """One request on a new connection (the kernel picks the worker anew for each)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session, \
            session.get(box.url + path) as resp:
        body = await resp.read()
        return resp.status, (orjson.loads(body) if path == "/v1/health" else body.decode())


def worker_pids(box: Box) -> dict[int, list[int]]:
    """Each worker slot's processes in the order the supervisor started them."""
    pids: dict[int, list[int]] = {}
    for index, pid in re.findall(r"worker (\d+) started \(pid (\d+)\)", box.log.read_text(errors="replace")):
        pids.setdefault(int(index), []).append(int(pid))
    return pids


async def answered_by(box: Box, pid: int, within: float) -> dict[str, Any]:
    """/v1/health from the worker whose pid is ``pid``, on fresh connections until it answers."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            _, health = await fresh(box, "/v1/health")
            if health["fleet"]["instance"].split("-")[-2] == str(pid):
                return health  # type: ignore[no-any-return]
        await asyncio.sleep(0.005)
    raise AssertionError(f"worker {pid} did not answer within {within}s:\n{box.log.read_text()}")
