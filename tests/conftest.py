"""Real servers on loopback: fake upstreams the tests script, and firstbyte itself."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from proxy.config import Config, parse_config
from proxy.gateway import Gateway
from proxy.observe import Finished
from proxy.routing.decision import ParsedDecision, parse_header
from proxy.server.app import build_app
from proxy.server.listener import Guard, GuardedRunner

from .redis_server import RedisServer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_on_loopback(app: web.Application, shutdown_timeout: float) -> tuple[web.AppRunner, str]:
    """Run ``app`` on a free loopback port as firstbyte runs (handler cancellation on)."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


class FakeUpstream:
    """An aiohttp server a test scripts per path; it records every request it gets."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.calls: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw) if raw else None
        headers = {str(k): v for k, v in request.headers.items()}
        self.calls.append({"path": request.path, "headers": headers, "json": body})
        handler = self.handlers.get(request.path) or self.handlers.get("*")
        if handler is None:
            return web.json_response({"error": {"message": "no handler"}}, status=404)
        return await handler(request)

    async def start(self) -> FakeUpstream:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self.runner, self.url = await serve_on_loopback(app, shutdown_timeout=0.5)
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def chat_body(text: str = "hello", model: str = "up") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else orjson.dumps(data).decode()
    return f"data: {payload}\n\n".encode()


def chunk_event(text: str, finish: str | None = None) -> bytes:
    return sse({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "up",
        "choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}],
    })


def ok_handler(text: str = "hello", chunks: int = 3) -> Handler:
    """Answers buffered or streamed, as the request asks."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(chat_body(text, body.get("model", "up")))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for i in range(chunks):
            await response.write(chunk_event(f"{text}{i}"))
        await response.write(chunk_event("", "stop"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


def status_handler(status: int, message: str = "nope", headers: dict[str, str] | None = None) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"error": {"message": message, "type": "upstream", "param": None, "code": str(status)}},
            status=status,
            headers=headers,
        )

    return handle


class Proxy:
    """firstbyte on a loopback port, with its gateway reachable for state checks."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.guards: list[Guard] = []  # the listener's connection guard, as `firstbyte serve` registers it
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.port = 0

    async def start(self) -> Proxy:
        """Served as ``firstbyte serve`` serves: its connections kept by the listener's guard."""
        guard = Guard(self.gateway.config.connections)
        self.guards.append(guard)
        self.runner = GuardedRunner(build_app(self.gateway), guard, internals=self.gateway.internals,
                                    handler_cancellation=True, shutdown_timeout=1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        async with aiohttp.ClientSession() as session:
            data = body if isinstance(body, bytes) else orjson.dumps(body)
            async with session.post(self.url + path, data=data, headers=headers or {}) as resp:
                return resp.status, dict(resp.headers), await resp.read()

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as resp:
            return resp.status, await resp.json(content_type=None)


def decision_of(headers: dict[str, str]) -> ParsedDecision:
    return parse_header(headers["x-route-decision"])


def make_config(raw: dict[str, Any], env: dict[str, str] | None = None) -> Config:
    return parse_config(copy.deepcopy(raw), env or {})


class Clock:
    """A clock the test moves by hand: no test sleeps to wait for a figure to expire."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[..., Awaitable[FakeUpstream]]]:
    started: list[FakeUpstream] = []

    async def start(handlers: dict[str, Handler]) -> FakeUpstream:
        up = await FakeUpstream(handlers).start()
        started.append(up)
        return up

    yield start
    for up in started:
        await up.stop()


@pytest.fixture
async def proxy() -> AsyncIterator[Callable[..., Awaitable[Proxy]]]:
    started: list[Proxy] = []
    given: list[Any] = []

    async def start(raw: dict[str, Any], env: dict[str, str] | None = None, **kwargs: Any) -> Proxy:
        p = await Proxy(Gateway(make_config(raw, env), **kwargs)).start()
        started.append(p)
        given.extend(kwargs.get("observers") or ())
        return p

    yield start
    for p in started:
        await p.stop()
    for observer in given:  # the gateway feeds observers, their owner closes them: here, the test
        await observer.close()


class RawUpstream:
    """A TCP server that speaks HTTP by hand, for faults aiohttp would tidy away."""

    def __init__(self, script: Callable[[Any, Any], Awaitable[None]]) -> None:
        self.script = script
        self.server: Any = None
        self.url = ""
        self.connections = 0

    async def _handle(self, reader: Any, writer: Any) -> None:
        self.connections += 1
        try:
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            await self.script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, NameError):
            pass
        finally:
            writer.close()

    async def start(self) -> RawUpstream:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def raw_upstreams() -> AsyncIterator[Callable[..., Awaitable[RawUpstream]]]:
    started: list[RawUpstream] = []

    async def start(script: Callable[[Any, Any], Awaitable[None]]) -> RawUpstream:
        up = await RawUpstream(script).start()
        started.append(up)
        return up

    yield start
    for up in started:
        await up.stop()


def route_config(
    targets: list[dict[str, Any]],
    providers: dict[str, dict[str, Any]],
    strategy: str = "ordered",
    **route: Any,
) -> dict[str, Any]:
    """A one-route ("chat") config for tests."""
    return {
        "providers": providers,
        "routes": {"chat": {"strategy": strategy, "targets": targets, **route}},
    }


def openai_provider(url: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "openai", "base_url": url + "/v1", **extra}


def pytest_collection_finish(session: Any) -> None:
    """Freeze what collection imported out of the collector's scans, as firstbyte's own ``run()``
    does. The client SDKs the tests load (openai, anthropic, the Agents SDK, LangChain) hold about
    300,000 objects; a full collection over them paused this process, which hosts the fault
    drill's loopback upstream and clients, for about half a second: a whole wave of 200 streams
    then missed the drill's 0.5 s first-chunk deadline."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault drill's figures (requests, faults, fds and RSS), when it ran."""
    import sys

    drill = sys.modules.get("tests.test_fault_drill")
    if drill is not None and drill.FIGURES:
        terminalreporter.section("fault drill")
        for line in drill.FIGURES:
            terminalreporter.write_line(line)


CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def streaming(*events: bytes) -> Handler:
    """An upstream that answers ``events`` as an SSE stream, a write each, then ends it."""
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for one in events:
            await response.write(one)
        await response.write_eof()
        return response

    return handle


async def chat_answered(p: Proxy) -> tuple[str | None, dict[str, str]]:
    """The content and headers of one chat call through ``p``, as the openai SDK reads them."""
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(**CHAT)
        return raw.parse().choices[0].message.content, dict(raw.headers)
    finally:
        await client.close()


async def chat_refused(p: Proxy) -> openai.APIStatusError:
    """The error the openai SDK raises for one chat call through ``p`` (the test fails if it answers)."""
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        with pytest.raises(openai.APIStatusError) as raised:
            await client.chat.completions.create(**CHAT)
    finally:
        await client.close()
    return raised.value


async def until(ready: Callable[[], bool], secs: float = 5.0) -> None:
    """Wait (bounded) for a condition on the proxy's state; the caller's assert says what failed."""
    deadline = time.monotonic() + secs
    while not ready() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


class Recorder:
    """An observer that keeps every finished exchange (the access log, metrics and ledger read the same)."""

    def __init__(self) -> None:
        self.seen: list[Finished] = []

    def on_finished(self, finished: Finished) -> None:
        self.seen.append(finished)

    async def close(self) -> None:
        pass


async def exchange(port: int, head: bytes, body: bytes = b"",
                   timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """One request over a raw socket; the status, headers and body of the answer (status 0: none)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    if not raw:
        return 0, {}, b""
    top, _, rest = raw.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


def post_head(length: int, path: str = "/v1/chat/completions", extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (path.encode(), length, extra))


def assert_openai_error(status: int, body: bytes, want: int, code: str | None = None) -> dict[str, object]:
    assert status == want, body[:300]
    err = orjson.loads(body)["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert {"message", "type", "param", "code"} <= set(err)
    if code is not None:
        assert err["code"] == code, err
    return err


FN = {"type": "function", "name": "get_weather", "description": "Weather now",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)')


def parse_text(line: str) -> tuple[str, dict[str, str]]:
    """Read a text line the way the module doc promises: time, then bare or JSON values."""
    time, _, rest = line.partition(" ")
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        match = _PAIR.match(rest, pos)
        assert match is not None, f"unparsable at {rest[pos:]!r}"
        raw = match.group(2)
        fields[match.group(1)] = json.loads(raw) if raw.startswith('"') else raw
        pos = match.end()
        if pos < len(rest):
            assert rest[pos] == " "
            pos += 1
    return time, fields


CONFIG = """\
model = "chat"
model_provider = "firstbyte"
web_search = "disabled"   # a built-in tool: only a provider with responses: true could run it

[model_providers.firstbyte]
name = "firstbyte"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "FIRSTBYTE_KEY"
"""



@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server per test session (persistence off, a password required); each test
    names its own fleet, so tests never read each other's keys."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may kill and start again."""
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.kill()


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("FIRSTBYTE_NO_PROMTOOL") == "1":
            pytest.skip("promtool not available and FIRSTBYTE_NO_PROMTOOL=1")
        pytest.fail("promtool not found: scripts/test installs it when run as root (apt-get install prometheus), "
                    "or set FIRSTBYTE_NO_PROMTOOL=1 where the platform cannot have it")
    return found


def stop_process(proc: subprocess.Popen[bytes] | None, log: Path) -> str:
    """Stop a ``firstbyte serve`` process gracefully (SIGTERM, then a kill after 10 s); what it logged."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return log.read_text(errors="replace")
