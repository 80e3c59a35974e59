"""What an upstream may not hand a client: copies of our own headers, hop-by-hop headers it names,
cookies meant for another client, and the provider key it was sent; and what a client that stops
reading may not hold: its stream, the upstream call and the provider's slot."""

from __future__ import annotations

import asyncio
import io
import socket

import openai
import orjson
import pytest
from aiohttp import web

from proxy.bounds import MAX_EVENT_CONTAINERS
from proxy.config import AccessLog as AccessLogConfig
from proxy.observe.accesslog import AccessLog
from proxy.routing.decision import parse_header

from .conftest import chat_body, chunk_event, openai_provider, route_config

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
KEY = "sk-live-0123456789abcdefSECRET"


async def raw_headers(p, body: dict[str, object]) -> tuple[int, list[tuple[str, str]], bytes]:
    """Every header line as sent, duplicates and case kept (a dict would hide the forged copy)."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(p.url + "/v1/chat/completions",
                                                                 data=orjson.dumps(body)) as resp:
        return resp.status, [(k.decode(), v.decode()) for k, v in resp.raw_headers], await resp.read()


def forging(stream: bool = False):
    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {"X-Route-Decision": "id=forged; route=chat; strategy=ordered; order=evil(written); served=evil",
                   "X-REQUEST-ID": "forged", "Connection": "keep-alive, X-RateLimit-Hop", "X-RateLimit-Hop": "hop",
                   "X-Not-Listed": "dropped", "X-RateLimit-Remaining-Requests": "99"}
        if not (await request.json()).get("stream"):
            return web.json_response(chat_body(), headers=headers)
        response = web.StreamResponse(headers={"content-type": "text/event-stream", **headers})
        await response.prepare(request)
        await response.write(chunk_event("a") + chunk_event("", "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
async def test_upstream_copies_of_our_headers_and_its_hop_headers_are_dropped(upstreams, proxy, stream):
    up = await upstreams({"/v1/chat/completions": forging()})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    status, headers, _ = await raw_headers(p, {**CHAT, "stream": stream})
    assert status == 200
    names = [k.lower() for k, _ in headers]
    assert names.count("x-route-decision") == 1 and names.count("x-request-id") == 1
    values = dict((k.lower(), v) for k, v in headers)
    decision = parse_header(values["x-route-decision"])
    assert decision.served == "up" and decision.id == values["x-request-id"] != "forged"
    assert "x-ratelimit-hop" not in names  # on the list, but hop-by-hop by the upstream's own say
    assert "x-not-listed" not in names  # not on the list (proxy/egress.py)
    assert values["x-ratelimit-remaining-requests"] == "99"
    assert values["x-upstream-request-id"] == "forged"  # the provider's id, under a name of its own


async def test_one_clients_upstream_cookie_never_rides_on_anothers_request(upstreams, proxy):
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(chat_body(), headers={"Set-Cookie": "session=client-a-only; Path=/"})

    up = await upstreams({"/v1/chat/completions": handle})
    # By name, not by IP: aiohttp's cookie jar ignores cookies from IP addresses.
    by_name = up.url.replace("127.0.0.1", "localhost")
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(by_name)}))
    for _ in range(2):
        status, headers, _ = await p.post("/v1/chat/completions", CHAT)
        assert status == 200
        assert "set-cookie" not in {k.lower() for k in headers}
    assert all("cookie" not in {k.lower() for k in call["headers"]} for call in up.calls), up.calls


@pytest.mark.parametrize("status", [401, 403, 429, 500])
async def test_the_provider_key_echoed_in_an_upstream_error_never_comes_back(upstreams, proxy, status):
    """Both shapes an upstream errs in: its own JSON, and text cut at 500 characters by firstbyte."""

    async def echo(request: web.Request) -> web.StreamResponse:
        sent = request.headers["authorization"]
        if request.path.startswith("/json/"):
            return web.json_response({"error": {"message": f"bad key {sent}", "type": "x"}}, status=status)
        return web.Response(text="x" * 490 + f" you sent {sent}", status=status)  # the key straddles 500

    up = await upstreams({"*": echo})
    raw = {"providers": {"j": openai_provider(up.url + "/json", api_key_env="K"),
                         "t": openai_provider(up.url + "/text", api_key_env="K")},
           "routes": {"j": {"targets": [{"provider": "j", "model": "m"}]},
                      "t": {"targets": [{"provider": "t", "model": "m"}]}}}
    p = await proxy(raw, {"K": KEY})
    auth = status in (401, 403)  # the provider refused firstbyte's key: a 502 in our words (docs/adr/0013)
    for route in ("j", "t"):
        got, _, body = await p.post("/v1/chat/completions", {**CHAT, "model": route})
        assert got == (502 if auth else status)
        assert orjson.loads(body)["error"]["message"]
        assert KEY not in body.decode() and KEY[:12] not in body.decode(), body
        if auth:
            assert b"refused firstbyte's key" in body and b"you sent" not in body and b"bad key" not in body
        else:
            assert b"[redacted]" in body or route == "t"  # t: cut at 500 characters, after the scrub
    assert up.calls[0]["headers"]["Authorization"] == f"Bearer {KEY}"  # it did reach the upstream


async def test_a_key_in_an_error_event_after_commit_reaches_neither_client_nor_log(upstreams, proxy):
    async def stream(request: web.Request) -> web.StreamResponse:
        sent = request.headers["x-api-key"]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'event: message_start\ndata: {"type":"message_start","message":{"id":"m"}}\n\n'
                             b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                             b'"delta":{"type":"text_delta","text":"partial answer"}}\n\n')
        error = {"type": "error", "error": {"type": "overloaded_error", "message": f"debug: {sent}"}}
        await response.write(b"event: error\ndata: " + orjson.dumps(error) + b"\n\n")
        await response.write_eof()
        return response

    up = await upstreams({"/v1/messages": stream})
    raw = {"providers": {"claude": {"kind": "anthropic", "base_url": up.url + "/v1", "api_key_env": "K"}},
           "routes": {"chat": {"targets": [{"provider": "claude", "model": "c"}]}}}
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    p = await proxy(raw, {"K": KEY}, observers=[access])
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await access.close()
    assert status == 200
    assert b"stream_interrupted" in body
    assert KEY not in body.decode() and "[redacted]" in body.decode()
    logged = lines.getvalue()
    assert "[redacted]" in logged and KEY not in logged


MESSAGES = {"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
_TEXT = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
         b'"delta":{"type":"text_delta","text":"partial"}}\n\n')
_START = b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":{}}}\n\n'


def _wide(frame: bytes, fields: bytes = b"", wide: int = MAX_EVENT_CONTAINERS - 1) -> bytes:
    """An event of exactly ``wide + 2`` objects and arrays (itself, ``x`` and ``wide`` empty arrays): one past
    MAX_EVENT_CONTAINERS by default."""
    return frame + b"{" + fields + b'"x":[' + b",".join([b"[]"] * wide) + b"]}\n\n"


# Python's words for the faults below (``'int' object is not iterable``): a client must never read them
_PYTHON = ("Error", "' object", "iterable", "unhashable", "attribute")


@pytest.mark.parametrize(("kind", "path", "opening", "wrong", "said"), [
    pytest.param("openai", "/v1/messages", chunk_event("partial"),
                 b'data: {"choices":[{"delta":{"tool_calls":5}}]}\n\n', "wrong types", id="openai-to-messages"),
    pytest.param("anthropic", "/v1/chat/completions", _START + _TEXT,
                 b'event: content_block_delta\ndata: {"type":"content_block_delta","index":[1],"delta":{}}\n\n',
                 "wrong types", id="anthropic-to-chat"),
    pytest.param("anthropic", "/v1/messages", _START + _TEXT,
                 b'event: error\ndata: {"type":"error","error":"boom"}\n\n', "boom", id="anthropic-passthrough"),
    pytest.param("openai", "/v1/chat/completions", chunk_event("partial"), b'data: {"choices":"oops"}\n\n',
                 "wrong types for its API (choices is a string, not a list)", id="openai-passthrough-choices"),
    pytest.param("openai", "/v1/chat/completions", chunk_event("partial"),
                 b'data: {"choices":[{"index":0,"delta":{"content":5}}]}\n\n',
                 "(delta.content is a number, not a string)", id="openai-passthrough-content"),
    pytest.param("openai", "/v1/messages", chunk_event("partial"),
                 b'data: {"choices":[{"index":0,"delta":{"content":5}}]}\n\n',
                 "(delta.content is a number, not a string)", id="openai-to-messages-content"),
    pytest.param("anthropic", "/v1/chat/completions", _START + _TEXT,
                 b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                 b'"delta":{"type":"text_delta","text":5}}\n\n', "wrong types", id="anthropic-to-chat-text"),
    pytest.param("anthropic", "/v1/messages", _START + _TEXT,
                 b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                 b'"delta":{"type":"text_delta","text":5}}\n\n', "(text_delta.text is not a string)",
                 id="anthropic-passthrough-text"),
    # orjson cannot read these, nor can a client's parser (the openai SDK raised RecursionError, and
    # ValueError past Python's 4,300 digits): they used to reach the client as they came
    pytest.param("openai", "/v1/chat/completions", chunk_event("partial"),
                 b'data: {"choices":[{"index":0,"delta":{"content":' + b'{"a":' * 2_000 + b"1"
                 + b"}" * 2_000 + b"}}]}\n\n",
                 "an upstream event could not be read as JSON (depth limit exceeded", id="openai-passthrough-deep"),
    pytest.param("openai", "/v1/chat/completions", chunk_event("partial"),
                 b'data: {"choices":[{"index":0,"delta":{"content":' + b"9" * 5_000_000 + b"}}]}\n\n",
                 "an upstream event could not be read as JSON (number is infinity", id="openai-passthrough-digits"),
    pytest.param("anthropic", "/v1/messages", _START + _TEXT,
                 b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                 b'"delta":{"type":"text_delta","text":' + b"[" * 2000 + b"]" * 2000 + b"}}\n\n",
                 "an upstream event could not be read as JSON (depth limit exceeded",
                 id="anthropic-passthrough-deep"),
    # The end review's (2026-12-06): well-typed content, then nesting no type search finds; the openai SDK
    # raised RecursionError in the application. And 700 levels, which orjson reads and a client's parser may not.
    pytest.param("openai", "/v1/chat/completions", chunk_event("partial"),
                 b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"x":' + b"[" * 5000 + b"]" * 5000
                 + b"}\n\n", "an upstream event could not be read as JSON (depth limit exceeded",
                 id="openai-passthrough-well-typed-deep"),
    pytest.param("openai", "/v1/chat/completions", chunk_event("partial"),
                 chunk_event("ok")[:-3] + b',"x":' + b"[" * 700 + b"]" * 700 + b"}\n\n",
                 "an upstream event nests its JSON more than 512 levels deep, past what a client's parser reads",
                 id="openai-passthrough-past-the-chunk-depth"),
    pytest.param("anthropic", "/v1/messages", _START + _TEXT,
                 b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                 b'"delta":{"type":"text_delta","text":"x"},"x":' + b"[" * 700 + b"]" * 700 + b"}\n\n",
                 "an upstream event nests its JSON more than 512 levels deep",
                 id="anthropic-passthrough-well-typed-deep"),
    # A harden review's (2026-12-06): a well-typed event of many empty arrays, not deep at all; orjson held the
    # loop building them (5M in 15 MB: ~0.5 s an event). Past MAX_EVENT_CONTAINERS it ends unparsed.
    *[pytest.param(kind, path, opening, wide, f"holds {MAX_EVENT_CONTAINERS + 1:,} JSON objects and arrays",
                   id=f"{name}-too-many-containers") for name, kind, path, opening, wide in [
        ("openai-passthrough", "openai", "/v1/chat/completions", chunk_event("partial"), _wide(b"data: ")),
        ("openai-to-messages", "openai", "/v1/messages", chunk_event("partial"), _wide(b"data: ")),
        ("anthropic-passthrough", "anthropic", "/v1/messages", _START + _TEXT,
         _wide(b"event: content_block_delta\ndata: ", b'"type":"content_block_delta","index":0,')),
        ("anthropic-to-chat", "anthropic", "/v1/chat/completions", _START + _TEXT,
         _wide(b"event: content_block_delta\ndata: ", b'"type":"content_block_delta","index":0,'))]],
    pytest.param("openai", "/v1/chat/completions", chunk_event("partial"),
                 _wide(b"data: ", wide=MAX_EVENT_CONTAINERS - 2) + chunk_event("", "stop") + b"data: [DONE]\n\n",
                 "", id="openai-passthrough-containers-at-the-cap-pass"),
])
async def test_a_wrongly_typed_event_after_commit_ends_the_stream_with_words_a_person_can_act_on(
        upstreams, proxy, kind, path, opening, wrong, said):
    """A reviewer's streams: content first (committed), then an event whose fields have the wrong
    types. The client's stream ends with an error event in its own protocol saying what was wrong,
    never Python's error text (it used to quote ``TypeError: 'int' object is not iterable``)."""
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(opening)
        await asyncio.sleep(0.05)  # a read of its own: after the commit
        await response.write(wrong)
        await response.write_eof()
        return response

    up = await upstreams({"*": stream})
    provider = {"kind": kind, "base_url": up.url + "/v1"}
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": provider}))
    status, _, body = await p.post(path, {**(MESSAGES if path == "/v1/messages" else CHAT), "stream": True})
    assert status == 200 and b"partial" in body, body[:300]
    if not said:  # within the bounds: relayed whole, and a success
        assert body.endswith(b"data: [DONE]\n\n") and body.count(b"[]") >= MAX_EVENT_CONTAINERS - 2, body[-300:]
        assert p.gateway.state.success_share(("up", "m")) == 1.0
        return
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    if path == "/v1/messages":
        assert last.startswith(b"event: error\n"), body
        error = orjson.loads(last.split(b"data: ", 1)[1])["error"]
    else:
        error = orjson.loads(last.removeprefix(b"data: "))["error"]
        assert error["code"] == "stream_interrupted"
    assert said in error["message"], error
    assert not any(word in error["message"] for word in _PYTHON), error
    assert p.gateway.state.success_share(("up", "m")) == 0.5  # committed, then a failure


async def sdk_reads(url: str) -> tuple[list[str | None], openai.APIError]:
    """What the openai SDK reads of a stream that ends with an error event: its words, and the error."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    words = []
    try:
        with pytest.raises(openai.APIError) as caught:
            async for chunk in await client.chat.completions.create(**CHAT, stream=True):
                words.append(chunk.choices[0].delta.content)
    finally:
        await client.close()
    return words, caught.value


async def test_the_openai_sdk_reads_a_wrongly_typed_event_after_commit_as_an_api_error(upstreams, proxy):
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_START + _TEXT)
        await asyncio.sleep(0.05)
        await response.write(b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                             b'"delta":"x"}\n\n')
        await response.write_eof()
        return response

    up = await upstreams({"/v1/messages": stream})
    p = await proxy(route_config([{"provider": "up", "model": "m"}],
                                 {"up": {"kind": "anthropic", "base_url": up.url + "/v1"}}))
    words, caught = await sdk_reads(p.url)
    assert words == ["", "partial"]
    assert "up: the upstream stream failed after it started (an upstream event's fields have the wrong types" \
        in caught.message, caught.message


async def test_the_openai_sdk_reads_a_well_typed_chunk_nested_past_its_parser_as_an_api_error(upstreams, proxy):
    """The end review's chunk (2026-12-06): content a client reads, then 5,000 nested arrays. No type search
    finds it; the openai SDK raised RecursionError in the application, now an APIError it can catch."""
    deep = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"x":' + b"[" * 5000 + b"]" * 5000 + b"}\n\n"

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("partial"))
        await asyncio.sleep(0.05)
        await response.write(deep)
        await response.write_eof()
        return response

    up = await upstreams({"/v1/chat/completions": stream})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    words, caught = await sdk_reads(p.url)
    assert words == ["partial"]
    assert "could not be read as JSON (depth limit exceeded" in caught.message, caught.message


async def test_brackets_in_answer_text_and_ordinary_nesting_pass_the_depth_check(upstreams, proxy):
    """The depth check's counts see brackets inside strings too: a 64 KB read of chunks whose text is
    brackets, and a chunk 20 levels deep, must reach the client whole (only a walk of the parsed event
    decides, and it finds them shallow)."""
    texts = ["[{" * 600] + ["[[[" * 20] * 250
    shallow = chunk_event("ok")[:-3] + b',"x":' + b"[" * 20 + b"]" * 20 + b"}\n\n"

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("first"))
        await asyncio.sleep(0.05)
        await response.write(b"".join(chunk_event(text) for text in texts) + shallow + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    up = await upstreams({"/v1/chat/completions": stream})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        words = [chunk.choices[0].delta.content async for chunk in
                 await client.chat.completions.create(**CHAT, stream=True)]
    finally:
        await client.close()
    assert "".join(words) == "first" + "".join(texts) + "ok"


# A client that stops reading: it asks for a stream, then takes no byte (a small receive buffer, never
# read). The relay waits in write(); before issue 31 it held the stream, the upstream connection and the
# provider's max_concurrent slot until the client left, whatever the deadlines said.

class Recorder:
    """An observer that keeps every finished exchange."""

    def __init__(self) -> None:
        self.finished: list[object] = []

    def on_finished(self, finished: object) -> None:
        self.finished.append(finished)

    async def close(self) -> None:
        pass


class Endless:
    """A streaming upstream that writes 16 KB events as fast as it may, until its client goes."""

    def __init__(self) -> None:
        self.open = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response(chat_body())
        self.open += 1
        try:
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            event = chunk_event("x" * 16384)
            while True:
                await response.write(event)
                await asyncio.sleep(0)
        except (ConnectionError, asyncio.CancelledError):
            return web.Response()  # the proxy let go of the call
        finally:
            self.open -= 1


async def non_reader(port: int) -> socket.socket:
    """A real client socket that asks for a stream and never reads (a 4 KB receive buffer)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window it offers
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    body = orjson.dumps({**CHAT, "stream": True})
    await loop.sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                  b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


async def stalled_pair(upstreams, proxy, timeouts: dict[str, float], connections: dict[str, float]):
    """Two non-reading clients on a ``max_concurrent: 2`` provider, holding both of its slots."""
    endless = Endless()
    up = await upstreams({"/v1/chat/completions": endless})
    recorder = Recorder()
    provider = openai_provider(up.url, max_concurrent=2, timeouts={"first_chunk": 5, "idle": 5, **timeouts})
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": provider},
                                    cooldown={"failures": 1, "secs": 30}),
                     "connections": connections}, observers=[recorder])
    socks = [await non_reader(p.port) for _ in range(2)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while endless.open < 2:  # both streams begun upstream
        assert loop.time() < deadline, "the streams never started"
        await asyncio.sleep(0.02)
    return p, endless, recorder, socks


async def freed_within(p, endless: Endless, secs: float) -> float:
    """How long until a reading client is served again and both upstream calls are let go."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    while True:
        status, _, body = await p.post("/v1/chat/completions", CHAT)
        if status == 200 and endless.open == 0:
            return loop.time() - t0
        assert loop.time() - t0 < secs, f"still held after {secs} s: {status} {body[:200]!r}, upstream open " \
                                        f"{endless.open}"
        await asyncio.sleep(0.1)


@pytest.mark.timeout(20)
async def test_clients_that_stop_reading_are_cut_at_the_send_timeout_and_free_the_slots(upstreams, proxy):
    p, endless, recorder, socks = await stalled_pair(upstreams, proxy, {"total": 600}, {"send_timeout": 0.5})
    status, _, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 503 and b"busy" in body  # both slots held meanwhile: the bound is what frees them
    took = await freed_within(p, endless, 5)
    assert [await cut_how(sock) for sock in socks] == ["reset", "reset"]
    assert took < 3
    await assert_the_clients_fault(p, recorder, "connections.send_timeout")
    assert p.guards[0].closed["send_timeout"] == 2


@pytest.mark.timeout(20)
async def test_clients_that_stop_reading_are_cut_at_the_streams_total_deadline(upstreams, proxy):
    p, endless, recorder, socks = await stalled_pair(upstreams, proxy, {"total": 1.5}, {"send_timeout": 60})
    took = await freed_within(p, endless, 6)
    assert [await cut_how(sock) for sock in socks] == ["reset", "reset"]
    assert took < 4
    await assert_the_clients_fault(p, recorder, "total timeout")


async def cut_how(sock: socket.socket) -> str:
    """How firstbyte ended a non-reader's connection: ``reset`` drops what its kernel still held for
    the client (a close would keep megabytes queued for a reader that may never come)."""
    loop = asyncio.get_running_loop()
    try:
        for _ in range(1000):
            if not await asyncio.wait_for(loop.sock_recv(sock, 65536), 2):
                return "closed"
        return "still sending"
    except ConnectionResetError:
        return "reset"
    finally:
        sock.close()


async def assert_the_clients_fault(p, recorder: Recorder, why: str) -> None:
    """Logged as the client's doing; the target's breaker heard nothing of it."""
    await asyncio.sleep(0.1)
    p.gateway.outbox.notify()
    streams = [f for f in recorder.finished if f.stream]  # type: ignore[attr-defined]
    assert len(streams) == 2
    for f in streams:
        assert f.status == 200 and f.error.startswith("client stopped reading") and why in f.error, f.error
    status, health = await p.get("/v1/health")
    target = health["targets"][0]
    assert (target["breaker"], target["failures"], target["in_flight"]) == ("closed", 0, 0), target


@pytest.mark.timeout(20)
async def test_a_client_reading_slowly_is_not_cut_by_the_send_timeout(upstreams, proxy):
    """400 KB/s against an upstream that writes as fast as it may: our transport stays paused for
    seconds at a time (the kernel wakes it only once much of a large send buffer is free), yet the
    client reads throughout and keeps its stream past many send timeouts."""
    endless = Endless()
    up = await upstreams({"/v1/chat/completions": endless})
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                     "connections": {"send_timeout": 0.3}})
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    body = orjson.dumps({**CHAT, "stream": True})
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    loop = asyncio.get_running_loop()
    t0, received = loop.time(), 0
    while loop.time() - t0 < 4:
        data = await asyncio.wait_for(reader.read(8192), 2)
        assert data, f"cut after {loop.time() - t0:.1f} s and {received} bytes while reading"
        received += len(data)
        await asyncio.sleep(0.02)
    writer.close()
    assert p.guards[0].closed["send_timeout"] == 0
    assert received > 200_000


@pytest.mark.parametrize("reads", [
    pytest.param([b"\xef\xbb\xbf" + chunk_event("one")], id="with-the-first-event"),
    pytest.param([b"\xef\xbb\xbf", chunk_event("one")], id="alone-then-the-event"),
    pytest.param([b"\xef", b"\xbb", b"\xbf" + chunk_event("one")], id="a-byte-a-read"),
    pytest.param([b"\xef\xbb", b"\xbf" + chunk_event("one")[:9], chunk_event("one")[9:]], id="cut-mid-event-too"),
])
async def test_a_bom_at_the_streams_start_keeps_its_first_token(upstreams, proxy, reads):
    """A reviewer's upstream began its stream with UTF-8's byte-order mark, which the SSE spec (WHATWG) ignores
    once at the start: the first event was dropped silently (its first line read as no data line), so the openai
    SDK got "two" for "one two". Its three bytes may arrive in reads of their own."""
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for read in reads:
            await response.write(read)
            await asyncio.sleep(0.02)  # a read of its own
        await response.write(chunk_event(" two") + chunk_event("", "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    up = await upstreams({"*": stream})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        words = [chunk.choices[0].delta.content async for chunk in await client.chat.completions.create(
            **CHAT, stream=True) if chunk.choices]
    finally:
        await client.close()
    assert "".join(w or "" for w in words) == "one two"
    assert p.gateway.state.success_share(("up", "m")) == 1.0
