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

import aiohttp
import orjson
from aiohttp import web
from body_hold import hold, serving

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
    body = {"model": "chat", "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}

    async def ask(session: aiohttp.ClientSession) -> str:
        async with session.post(f"http://127.0.0.1:{args.port}{path}", json=body) as resp:
            got = await resp.read()
            ended = " error event" if stream and b"error" in got[-600:] else ""
            return f"{resp.status} {len(got):,} B{ended}"

    up = subprocess.Popen([sys.executable, __file__, "--upstream", "--port", str(args.port + 1), "--answer",
                           args.answer])
    try:
        quiet, busy, seen = serving(CONFIG.format(port=args.port, up=args.port + 1), args.port,
                                    lambda url: hold(url, ask, args.asks), wait=30)
    finally:
        up.terminate()
        up.wait(10)
    print(f"{args.mode} {args.answer}: {seen}; worst /healthz quiet {quiet * 1e3:.1f} ms, "
          f"while answering {busy * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
