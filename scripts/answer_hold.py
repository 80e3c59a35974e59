"""How long one upstream answer holds firstbyte's event loop: the worst /healthz latency while it is relayed.

Starts a fake OpenAI upstream (its own process) and ``firstbyte serve`` on a one-target config on loopback
ports ``--port`` and ``--port + 1``, polls ``/healthz`` every 20 ms, asks for the answer (a few times, one
after another) and prints the worst /healthz latency beside a quiet baseline. ``--answer wide`` is a harden
review's: 5M empty arrays (15 MB of ``[],``); ``cap`` sits at the cap (MAX_EVENT_CONTAINERS for a streamed
event, MAX_ANSWER_CONTAINERS for a buffered answer), ``normal`` is a short answer. A streamed answer sends a
content chunk first (the commit), then the answer as one event. Bounded: a few requests, a few seconds.

    .venv/bin/python scripts/answer_hold.py --port 23000 --mode chat-stream --answer wide
    (modes: chat-stream, messages-stream, chat-buffered, messages-buffered)
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from proxy.bounds import MAX_ANSWER_CONTAINERS, MAX_EVENT_CONTAINERS

CONFIG = """listen: 127.0.0.1:{port}
access_log: {{format: text, path: "-"}}
providers:
  up: {{kind: openai, base_url: "http://127.0.0.1:{up}/v1", timeouts: {{first_chunk: 30, idle: 60, total: 120}}}}
routes:
  chat: {{strategy: ordered, targets: [{{provider: up, model: m}}]}}
"""

MODES = {"chat-stream": ("/v1/chat/completions", True), "messages-stream": ("/v1/messages", True),
         "chat-buffered": ("/v1/chat/completions", False), "messages-buffered": ("/v1/messages", False)}


def chunk(text: str, finish: str | None = None) -> dict[str, object]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}


def answer(kind: str, stream: bool) -> bytes:
    """The answer's JSON: a chunk (streamed) or a completion (buffered) with ``x``: empty arrays."""
    base: dict[str, object] = chunk("wide") if stream else {
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "wide"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    if kind == "normal":
        return orjson.dumps(base)
    count = 5_000_000 if kind == "wide" else (MAX_EVENT_CONTAINERS if stream else MAX_ANSWER_CONTAINERS) - 8
    return orjson.dumps({**base, "x": None}).replace(b'"x":null', b'"x":[' + b",".join([b"[]"] * count) + b"]")


def upstream(port: int, kind: str) -> None:
    """The fake upstream, run as its own process (``--upstream``): its writes must not delay our polls."""
    streamed, buffered = answer(kind, True), answer(kind, False)

    async def handle(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.Response(body=buffered, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + orjson.dumps(chunk("first")) + b"\n\n")
        await asyncio.sleep(0.05)
        await response.write(b"data: " + streamed + b"\n\n")
        await response.write(b"data: " + orjson.dumps(chunk("", "stop")) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def poll(url: str, stop: asyncio.Event, worst: list[float]) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(url + "/healthz") as resp:
                await resp.read()
            worst.append(time.perf_counter() - started)
            await asyncio.sleep(0.02)


async def measure(url: str, path: str, stream: bool, asks: int) -> tuple[float, float, list[str]]:
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
    body = {"model": "chat", "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        for _ in range(asks):
            await asyncio.sleep(0.2)
            async with session.post(url + path, json=body) as resp:
                got = await resp.read()
                ended = " error event" if stream and b"error" in got[-600:] else ""
                seen.append(f"{resp.status} {len(got):,} B{ended}")
    await asyncio.sleep(0.2)
    stop.set()
    await task
    return max(quiet), max(busy), seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=sorted(MODES), default="chat-stream")
    parser.add_argument("--answer", choices=("wide", "cap", "normal"), default="wide")
    parser.add_argument("--asks", type=int, default=3)
    parser.add_argument("--upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        return upstream(args.port, args.answer)
    path, stream = MODES[args.mode]
    up = subprocess.Popen([sys.executable, __file__, "--upstream", "--port", str(args.port + 1), "--answer",
                           args.answer])
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "routes.yaml"
        config.write_text(CONFIG.format(port=args.port, up=args.port + 1))
        exe = Path(sys.executable).with_name("firstbyte")
        server = subprocess.Popen([str(exe), "serve", "--config", str(config)], stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{args.port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    quiet, busy, seen = asyncio.run(measure(url, path, stream, args.asks))
                    break
                except aiohttp.ClientConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.3)
        finally:
            server.terminate()
            up.terminate()
            server.wait(10)
            up.wait(10)
    print(f"{args.mode} {args.answer}: {seen}; worst /healthz quiet {quiet * 1e3:.1f} ms, "
          f"while answering {busy * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
