"""scripts/fleet_drill.py: what a fleet of firstbyte processes sends a failing target, with and without Redis.

On loopback it starts a ``redis-server`` (free port, persistence off), two fake upstreams (``bad``
answers 503 once told to fail, ``good`` answers after 10 ms; ``slow`` 60 ms), and ``--instances``
real ``firstbyte serve`` processes whose route ``chat`` (ordered: bad, good; cooldown
``--threshold``) and route ``cold`` (fastest: slow, good) share one fleet. A round-robin client
at ``--concurrency``:

1. cold start: ``--cold`` requests on ``cold``; counts the calls ``slow`` got (its measuring calls);
2. ``bad`` starts failing; requests on ``chat`` until every instance's /v1/health shows it open;
   counts the failed calls ``bad`` got, fleet-wide.

``--alone`` runs the same without ``state`` (each instance learns alone). Bounded: at most
``--max-requests`` requests per phase. Usage:

    .venv/bin/python scripts/fleet_drill.py [--instances 3 --threshold 3 --concurrency 3] [--alone]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Upstreams:
    """bad / good / slow on one aiohttp server, by path prefix; counts calls per name."""

    def __init__(self) -> None:
        self.calls = {"bad": 0, "good": 0, "slow": 0}
        self.failing = False
        self.port = free_port()

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/{name}/v1/chat/completions", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls[name] += 1
        await request.read()
        if name == "bad" and self.failing:
            return web.json_response({"error": {"message": "down", "type": "server_error"}}, status=503)
        await asyncio.sleep(0.06 if name == "slow" else 0.01)
        return web.json_response({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                               "finish_reason": "stop"}]})


def config(port: int, up: int, redis: str | None, threshold: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{up}"
    providers = {n: {"kind": "openai", "base_url": f"{base}/{n}/v1"} for n in ("bad", "good", "slow")}
    return {
        "listen": f"127.0.0.1:{port}", "access_log": {"path": "/dev/null"}, "shutdown_grace": 1,
        **({"state": {"redis": redis, "fleet": "drill"}} if redis else {}),
        "providers": providers,
        "routes": {
            "chat": {"strategy": "ordered", "cooldown": {"failures": threshold, "secs": 60},
                     "targets": [{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}]},
            "cold": {"strategy": "fastest", "fastest": {"explore": 0},
                     "targets": [{"provider": "slow", "model": "m"}, {"provider": "good", "model": "m"}]},
        },
    }


async def ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(1200):
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url + "/readyz") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.025)
    raise SystemExit(f"{url} never became ready")


async def round_robin(session: aiohttp.ClientSession, urls: list[str], route: str, concurrency: int,
                      limit: int, stop: Any) -> int:
    sent = 0

    async def client(k: int) -> None:
        nonlocal sent
        i = k
        while sent < limit and not stop():
            sent += 1
            body = {"model": route, "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(urls[i % len(urls)] + "/v1/chat/completions", json=body) as resp:
                await resp.read()
            i += 1

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return sent


async def drill(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fleet-drill-"))
    procs: list[subprocess.Popen[bytes]] = []
    redis_url = None
    if not args.alone:
        rport = free_port()
        binary = shutil.which("redis-server") or sys.exit("redis-server is not installed")
        procs.append(subprocess.Popen([binary, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL))
        redis_url = f"redis://127.0.0.1:{rport}/0"
        await asyncio.sleep(0.3)
    ups = Upstreams()
    runner = await ups.start()
    urls = []
    try:
        for i in range(args.instances):
            port = free_port()
            path = tmp / f"fb{i}.json"
            path.write_text(json.dumps(config(port, ups.port, redis_url, args.threshold)))
            procs.append(subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--config", str(path)],
                                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession() as session:
            for url in urls:
                await ready(session, url)
            return await measure(args, session, ups, urls)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        await runner.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


async def measure(args: argparse.Namespace, session: aiohttp.ClientSession, ups: Upstreams,
                  urls: list[str]) -> dict[str, Any]:
    """The cold start, then the failing target until every instance has excluded it."""
    await round_robin(session, urls, "cold", args.concurrency, args.cold, lambda: False)
    measuring = ups.calls["slow"]
    ups.failing = True
    opened: set[str] = set()

    async def watch() -> None:
        while len(opened) < len(urls):
            for url in urls:
                async with session.get(url + "/v1/health") as resp:
                    rows = (await resp.json())["targets"]
                if any(r["route"] == "chat" and r["target"] == "bad" and r["breaker"] != "closed" for r in rows):
                    opened.add(url)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    started = time.monotonic()
    sent = await round_robin(session, urls, "chat", args.concurrency, args.max_requests,
                             lambda: len(opened) == len(urls))
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(watcher, 2.0)
    return {"mode": "alone" if args.alone else "fleet", "instances": args.instances, "threshold": args.threshold,
            "concurrency": args.concurrency, "measuring_calls_after_cold_start": measuring,
            "failed_calls_before_all_excluded": ups.calls["bad"], "requests_sent": sent,
            "all_excluded": len(opened) == len(urls), "seconds": round(time.monotonic() - started, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--threshold", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--cold", type=int, default=9, help="requests on the cold route")
    p.add_argument("--max-requests", type=int, default=200)
    p.add_argument("--alone", action="store_true", help="no state section: each instance learns alone")
    args = p.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    print(json.dumps(asyncio.run(drill(args))))


if __name__ == "__main__":
    main()
