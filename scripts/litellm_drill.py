"""scripts/litellm_drill.py: fleet_drill's failing-target run against LiteLLM's proxy sharing Redis.

Issue 26 asks for LiteLLM side by side on the same run: ``--instances`` LiteLLM proxies (one model
group ``chat`` of two deployments on fleet_drill's fake upstreams, ``bad`` tried first by ``order``,
``router_settings`` with ``redis_host``/``redis_port``, ``allowed_fails`` and ``cooldown_time``) behind
the same round-robin client. ``bad`` starts failing (503) before the first request; the client sends
one request at a time, round-robin, and counts the calls ``bad`` got fleet-wide. An instance has
excluded ``bad`` once a request sent to it did not reach ``bad`` (with ``order`` every request tries
``bad`` first until it is cooled down); the run ends two rounds after every instance has, or at
``--max-requests``. ``num_retries: 0``: a failed call is the client's (the count is the upstream's).

LiteLLM is not a dependency of firstbyte: ``scripts/litellm-drill`` installs it into a venv under /tmp
and runs this file with that venv's Python. Not run by the test suite.

    scripts/litellm-drill [--instances 3 --allowed-fails 3] [--port-base 42400]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_drill

# Loopback only: LiteLLM's own cost map, not a fetch from GitHub (retried three times at each start);
# no telemetry. The proxy refuses to start without a master key: a throwaway one, sent by the client.
MASTER_KEY = "sk-drill-" + secrets.token_hex(16)
OFFLINE = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
           "LITELLM_MASTER_KEY": MASTER_KEY}


def take_ports(base: int, count: int) -> list[int]:
    """``count`` ports from ``base`` (0: the kernel's choice each)."""
    return [base + i for i in range(count)] if base else [fleet_drill.free_port() for _ in range(count)]


def litellm_config(up: int, redis_port: int, args: argparse.Namespace) -> dict[str, Any]:
    base = f"http://127.0.0.1:{up}"
    deployment = [{"model_name": "chat", "litellm_params": {"model": "openai/m", "api_base": f"{base}/{name}/v1",
                                                           "api_key": "none", "order": order}}
                  for order, name in ((1, "bad"), (2, "good"))]
    return {"model_list": deployment,
            "router_settings": {"redis_host": "127.0.0.1", "redis_port": redis_port,
                                "allowed_fails": args.allowed_fails, "cooldown_time": 60, "num_retries": 0,
                                "routing_strategy": "simple-shuffle"},
            "litellm_settings": {"num_retries": 0, "request_timeout": 10}}


async def ready(session: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 900  # LiteLLM's proxy took minutes to import on the busy shared box
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"litellm at {url} exited with {proc.returncode}")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url + "/health/liveliness") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.25)
    raise SystemExit(f"{url} never became ready")


async def failing_run(session: aiohttp.ClientSession, ups: fleet_drill.Upstreams, urls: list[str],
                      max_requests: int) -> dict[str, Any]:
    """One request at a time, round-robin; which instances have stopped sending to ``bad``."""
    ups.failing = True
    excluded: set[int] = set()
    statuses: dict[int, int] = {}
    rounds_after = 0
    sent = 0
    started = time.monotonic()
    while sent < max_requests and rounds_after < 2 * len(urls):
        i = sent % len(urls)
        before = ups.calls["bad"]
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(urls[i] + "/v1/chat/completions", json=body,
                                headers={"authorization": f"Bearer {MASTER_KEY}"}) as resp:
            await resp.read()
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
        sent += 1
        if ups.calls["bad"] == before:
            excluded.add(i)
        if len(excluded) == len(urls):
            rounds_after += 1
    return {"failed_calls_before_all_excluded": ups.calls["bad"], "requests_sent": sent,
            "all_excluded": len(excluded) == len(urls), "client_statuses": statuses,
            "seconds": round(time.monotonic() - started, 3)}


async def drill(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="litellm-drill-"))
    ports = take_ports(args.port_base, 2 + args.instances)
    redis_port, up_port, fb_ports = ports[0], ports[1], ports[2:]
    binary = shutil.which("redis-server") or sys.exit("redis-server is not installed")
    procs = [subprocess.Popen([binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL)]
    ups = fleet_drill.Upstreams()
    ups.port = up_port
    runner = await ups.start()
    litellm = str(Path(sys.executable).parent / "litellm")
    try:
        path = tmp / "litellm.json"
        path.write_text(json.dumps(litellm_config(up_port, redis_port, args)))
        urls = [f"http://127.0.0.1:{port}" for port in fb_ports]
        for port in fb_ports:
            log = open(tmp / f"litellm-{port}.log", "wb")  # noqa: SIM115 (the process holds it)
            procs.append(subprocess.Popen([litellm, "--config", str(path), "--host", "127.0.0.1", "--port", str(port),
                                           "--num_workers", "1"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                                          env=OFFLINE))
        async with aiohttp.ClientSession() as session:
            for url, proc in zip(urls, procs[1:], strict=True):
                await ready(session, url, proc)
            result = await failing_run(session, ups, urls, args.max_requests)
        return {"proxy": "litellm", "version": version(), "instances": args.instances,
                "allowed_fails": args.allowed_fails, **result}
    except SystemExit:
        keep = Path(tempfile.mkdtemp(prefix="litellm-drill-logs-"))
        for done in sorted(tmp.glob("litellm-*.log")):
            shutil.copy(done, keep)
        print(f"the proxies' logs: {keep}", file=sys.stderr)
        raise
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
        await runner.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def version() -> str:
    from importlib.metadata import version as of

    return of("litellm")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--allowed-fails", type=int, default=3, help="router_settings.allowed_fails")
    p.add_argument("--max-requests", type=int, default=120)
    p.add_argument("--port-base", type=int, default=0, help="redis, upstream, then one port per instance")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its processes
    print(json.dumps(asyncio.run(drill(p.parse_args()))))


if __name__ == "__main__":
    main()
