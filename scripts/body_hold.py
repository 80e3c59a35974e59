"""How long one request body holds firstbyte's event loop: the worst /healthz latency while it is posted.

Starts ``firstbyte serve`` on a one-target config (the simulated provider: no network) on a loopback
port, polls ``/healthz`` every 20 ms, posts the body (a few times, one after another) and prints the
worst /healthz latency beside a quiet baseline. Bounded: a few requests and a few seconds.

    .venv/bin/python scripts/body_hold.py --port 21000 --body bomb     # 1.3M empty arrays, 3.9 MB
    .venv/bin/python scripts/body_hold.py --port 21000 --body normal   # a chat request with 40 tools
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiohttp
import orjson

CONFIG = """listen: 127.0.0.1:{port}
access_log: {{format: text, path: "-"}}
providers:
  sim: {{kind: simulated, simulate: {{first_chunk_ms: 1, jitter_ms: 0, chunk_ms: 0, chunks: 1}}}}
routes:
  chat: {{strategy: ordered, targets: [{{provider: sim, model: sim-1}}]}}
"""

T = TypeVar("T")

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
TOOLS = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object", "properties": {
    "a": {"type": "array", "items": {"type": "string"}}}}}} for i in range(40)]
BODIES = {
    "bomb": lambda: orjson.dumps(CHAT)[:-1] + b', "metadata": {"x": [' + b",".join([b"[]"] * 1_300_000) + b"]}}",
    "cap": lambda: orjson.dumps(CHAT)[:-1] + b', "metadata": {"x": [' + b",".join([b"[]"] * 99_990) + b"]}}",
    "normal": lambda: orjson.dumps({**CHAT, "tools": TOOLS}),
}


async def poll(url: str, stop: asyncio.Event, worst: list[float]) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(url + "/healthz") as resp:
                await resp.read()
            worst.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)


async def hold(url: str, ask: Callable[[aiohttp.ClientSession], Awaitable[T]], times: int) -> tuple[
        float, float, list[T]]:
    """The worst /healthz latency over a quiet second, then while ``ask`` runs ``times`` times, 0.2 s apart."""
    quiet: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(poll(url, stop, quiet))
    await asyncio.sleep(1.0)
    stop.set()
    await task
    busy: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(poll(url, stop, busy))
    seen = []
    async with aiohttp.ClientSession() as session:
        for _ in range(times):
            await asyncio.sleep(0.2)
            seen.append(await ask(session))
    await asyncio.sleep(0.2)
    stop.set()
    await task
    return max(quiet), max(busy), seen


def serving(config: str, port: int, measure: Callable[[str], Awaitable[T]], wait: float = 20) -> T:
    """``measure(url)`` against ``firstbyte serve`` on ``config`` (a routes.yaml's text), once it answers."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "routes.yaml"
        path.write_text(config)
        exe = Path(sys.executable).with_name("firstbyte")
        server = subprocess.Popen([str(exe), "serve", "--config", str(path)], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    return asyncio.run(measure(f"http://127.0.0.1:{port}"))
                except aiohttp.ClientConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        finally:
            server.terminate()
            server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", choices=sorted(BODIES), default="bomb")
    parser.add_argument("--posts", type=int, default=3)
    args = parser.parse_args()
    body = BODIES[args.body]()

    async def post(session: aiohttp.ClientSession) -> int:
        async with session.post(f"http://127.0.0.1:{args.port}/v1/chat/completions", data=body,
                                headers={"content-type": "application/json"}) as resp:
            await resp.read()
            return resp.status

    quiet, busy, statuses = serving(CONFIG.format(port=args.port), args.port, lambda url: hold(url, post, args.posts))
    print(f"body {args.body}: {len(body):,} bytes, statuses {statuses}; worst /healthz quiet {quiet * 1e3:.1f} ms, "
          f"while posting {busy * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
