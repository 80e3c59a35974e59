"""The provider key never comes back: an upstream that echoes the key it was sent, in every way an
upstream has of saying something other than an answer, on every endpoint and dialect.

Each case is a fake upstream that quotes its ``Authorization`` / ``x-api-key`` (a 200 whose body is
an error object, an error event before the first token, a malformed event, an error after the
commit, an escaped copy) and always sends it back in a header too (``X-Debug-Auth``). The client is
raw aiohttp (every header line as sent) and, for chat, the openai SDK; the key must appear in no
body, no header and no access-log line, and no long piece of it either.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from proxy.config import AccessLog as AccessLogConfig
from proxy.observe.accesslog import AccessLog

from .anthropic_fakes import event as anthropic_event
from .anthropic_fakes import message_body
from .conftest import chunk_event

KEY = "sk-live-0123456789abcdefSECRETxyz"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "chat", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "chat", "input": "hi"}
COMPLETIONS = {"model": "chat", "prompt": "hi"}


def _sent(request: web.Request) -> str:
    return request.headers.get("x-api-key") or request.headers.get("authorization", "")


def _escaped(text: str) -> str:
    """``text`` with every character \\u-escaped, as a JSON string's inside may legally be."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


Says = Callable[[str], bytes]  # the key as sent -> the upstream's body


def answer(body: Says, status: int = 200, stream: bool = False, headers: bool = False) -> Callable[..., Any]:
    """The upstream's answer: ``body`` quoting the key it was sent; with ``headers``, the key in a
    debug header and in a listed (rate-limit) header too."""

    async def handle(request: web.Request) -> web.StreamResponse:
        sent = _sent(request)
        extra = {"X-Debug-Auth": sent, "x-ratelimit-remaining-requests": f"9 {sent}"} if headers else {}
        return web.Response(body=body(sent), status=status,
                            headers={"content-type": "text/event-stream" if stream else "application/json", **extra})

    return handle


def openai_error(kind: str) -> Says:
    return lambda sent: orjson.dumps({"error": {"message": f"debug: you sent {sent}", "type": kind, "code": sent}})


def sse(payload: bytes, name: str | None = None) -> bytes:
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + payload + b"\n\n"


def role_only() -> bytes:
    return sse(orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                             "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}))


def anthropic_error(sent: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": sent, "message": f"debug: you sent {sent}"}})


def responses_event(kind: str, **fields: Any) -> bytes:
    return sse(orjson.dumps({"type": kind, "sequence_number": 0, **fields}), kind)


CREATED = responses_event("response.created", response={"id": "r", "status": "in_progress", "output": []})

# (id, client path, body, provider kind, provider extras, upstream path, handler)
CASES = [
    pytest.param("/v1/chat/completions", CHAT, "openai", {}, "/v1/chat/completions",
                 answer(openai_error("invalid_request_error")), id="chat-200-error-body-returned"),
    pytest.param("/v1/chat/completions", CHAT, "openai", {}, "/v1/chat/completions",
                 answer(openai_error("server_error")), id="chat-200-error-body-failed-over"),
    pytest.param("/v1/chat/completions", CHAT, "openai", {}, "/v1/chat/completions",
                 answer(lambda s: orjson.dumps({"error": {"message": _escaped(s), "type": "invalid_request_error"}})
                        .replace(b"\\\\u", b"\\u")), id="chat-200-error-body-key-escaped"),
    pytest.param("/v1/chat/completions", CHAT, "openai", {}, "/v1/chat/completions",
                 answer(lambda s: orjson.dumps({"error": {"message": _escaped(s), "type": "x"}})
                        .replace(b"\\\\u", b"\\u"), status=400), id="chat-400-error-body-key-escaped"),
    pytest.param("/v1/chat/completions", {**CHAT, "stream": True}, "openai", {}, "/v1/chat/completions",
                 answer(lambda s: role_only() + sse(openai_error("invalid_request_error")(s)), stream=True),
                 id="chat-stream-error-event-before-token"),
    pytest.param("/v1/chat/completions", {**CHAT, "stream": True}, "openai", {}, "/v1/chat/completions",
                 answer(lambda s: role_only() + f"data: x{s}{s}\n\n".encode(), stream=True),
                 id="chat-stream-malformed-event-quoting-key"),
    pytest.param("/v1/chat/completions", CHAT, "anthropic", {}, "/v1/messages", answer(anthropic_error),
                 id="chat-via-anthropic-200-error-body"),
    pytest.param("/v1/chat/completions", {**CHAT, "stream": True}, "anthropic", {}, "/v1/messages",
                 answer(lambda s: sse(anthropic_error(s), "error"), stream=True),
                 id="chat-via-anthropic-error-event-before-token"),
    pytest.param("/v1/messages", MESSAGES, "anthropic", {}, "/v1/messages", answer(anthropic_error),
                 id="messages-200-error-body"),
    pytest.param("/v1/messages", {**MESSAGES, "stream": True}, "anthropic", {}, "/v1/messages",
                 answer(lambda s: anthropic_event("message_start", {"message": message_body()})
                        + sse(anthropic_error(s), "error"), stream=True), id="messages-error-event-before-token"),
    pytest.param("/v1/messages", {**MESSAGES, "stream": True}, "openai", {}, "/v1/chat/completions",
                 answer(lambda s: sse(openai_error("server_error")(s)), stream=True),
                 id="messages-via-chat-error-event-before-token"),
    pytest.param("/v1/completions", COMPLETIONS, "openai", {}, "/v1/completions",
                 answer(openai_error("invalid_request_error")), id="completions-200-error-body"),
    pytest.param("/v1/completions", {**COMPLETIONS, "stream": True}, "openai", {}, "/v1/completions",
                 answer(lambda s: sse(openai_error("overloaded")(s)), stream=True),
                 id="completions-error-event-before-token"),
    pytest.param("/v1/responses", RESPONSES, "openai", {"responses": True}, "/v1/responses",
                 answer(openai_error("invalid_request_error")), id="responses-native-200-error-body"),
    pytest.param("/v1/responses", {**RESPONSES, "stream": True}, "openai", {"responses": True}, "/v1/responses",
                 answer(lambda s: CREATED + responses_event("error", code=s, message=f"you sent {s}"), stream=True),
                 id="responses-native-error-event-before-token"),
    pytest.param("/v1/responses", {**RESPONSES, "stream": True}, "openai", {"responses": True}, "/v1/responses",
                 answer(lambda s: CREATED + responses_event(
                     "response.failed", response={"error": {"code": s, "message": f"you sent {s}"}}), stream=True),
                 id="responses-native-failed-before-token"),
    pytest.param("/v1/responses", {**RESPONSES, "stream": True}, "openai", {"responses": True}, "/v1/responses",
                 answer(lambda s: CREATED + responses_event("response.output_text.delta", delta="par")
                        + responses_event("error", code="x", message=f"you sent {s}"), stream=True),
                 id="responses-native-error-event-after-commit"),
    pytest.param("/v1/responses", {**RESPONSES, "stream": True}, "openai", {}, "/v1/chat/completions",
                 answer(lambda s: sse(openai_error("invalid_request_error")(s)), stream=True),
                 id="responses-via-chat-error-event-before-token"),
    pytest.param("/v1/responses", RESPONSES, "anthropic", {}, "/v1/messages", answer(anthropic_error),
                 id="responses-via-anthropic-200-error-body"),
    pytest.param("/v1/messages/count_tokens", {k: v for k, v in MESSAGES.items() if k != "max_tokens"},
                 "anthropic", {}, "/v1/messages/count_tokens", answer(anthropic_error), id="count-tokens-200-error"),
]


async def _ask(url: str, body: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, data=orjson.dumps(body)) as resp:
        return resp.status, [(k.decode(), v.decode()) for k, v in resp.raw_headers], await resp.read()


def _leaks(text: str) -> bool:
    """The key, or any 12 characters of it, in ``text``, as it is or once JSON's \\u escapes are read."""
    read = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), text)
    return any(KEY[i:i + 12] in t for t in (text, read) for i in range(len(KEY) - 11))


async def _gateway(upstreams, proxy, kind: str, extra: dict[str, Any], path: str, handler: Any):
    up = await upstreams({path: handler})
    raw = {"providers": {"up": {"kind": kind, "base_url": up.url + "/v1", "api_key_env": "K", **extra}},
           "routes": {"chat": {"targets": [{"provider": "up", "model": "m"}]}}}
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    p = await proxy(raw, {"K": KEY}, observers=[access])
    return up, p, access, lines


@pytest.mark.parametrize(("path", "body", "kind", "extra", "upstream_path", "handler"), CASES)
async def test_an_echoed_key_reaches_no_client_by_body_or_log(upstreams, proxy, path, body, kind, extra,
                                                              upstream_path, handler):
    up, p, access, lines = await _gateway(upstreams, proxy, kind, extra, upstream_path, handler)
    status, headers, answer_body = await _ask(p.url + path, body)
    await access.close()
    assert up.calls and KEY in _sent_of(up.calls[0])  # the upstream had the key to echo
    text = answer_body.decode()
    assert not _leaks(text), text
    assert not any(_leaks(v) for _, v in headers), headers
    assert not _leaks(lines.getvalue()), lines.getvalue()
    assert "[redacted]" in text, (status, text)  # the upstream's words did come back, scrubbed


def _sent_of(call: dict[str, Any]) -> str:
    return call["headers"].get("x-api-key") or call["headers"].get("Authorization", "")


def _chat_answer(stream: bool) -> Says:
    def says(sent: str) -> bytes:
        if stream:
            return chunk_event("hi") + chunk_event("", "stop") + b"data: [DONE]\n\n"
        return orjson.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})

    return says


@pytest.mark.parametrize(("status", "stream"), [pytest.param(200, False, id="buffered-answer"),
                                                pytest.param(200, True, id="streamed-answer"),
                                                pytest.param(404, False, id="client-error-returned")])
async def test_an_echoed_key_reaches_no_client_by_header(upstreams, proxy, status, stream):
    says = _chat_answer(stream) if status == 200 else openai_error("invalid_request_error")
    handler = answer(says, status=status, stream=stream, headers=True)
    up, p, access, _ = await _gateway(upstreams, proxy, "openai", {}, "/v1/chat/completions", handler)
    got, headers, body = await _ask(p.url + "/v1/chat/completions", {**CHAT, "stream": stream})
    await access.close()
    assert got == status
    names = {k.lower(): v for k, v in headers}
    assert "x-debug-auth" not in names  # not on the list (proxy/egress.py)
    assert names["x-ratelimit-remaining-requests"] == "9 Bearer [redacted]"  # on it, and scrubbed
    assert not any(_leaks(v) for _, v in headers), headers


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_the_openai_sdk_sees_no_key_in_an_error_inside_a_200(upstreams, proxy, stream):
    def says(sent: str) -> bytes:
        return orjson.dumps({"error": {"message": f"debug: you sent {sent}", "type": "invalid_request_error"}})

    handler = answer(lambda s: role_only() + sse(says(s)), stream=True) if stream else answer(says)
    up, p, access, _ = await _gateway(upstreams, proxy, "openai", {}, "/v1/chat/completions", handler)
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="client-key", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}],
                                                 stream=stream)
    finally:
        await client.close()
        await access.close()
    error = caught.value
    assert "[redacted]" in str(error) and not _leaks(str(error)) and not _leaks(orjson.dumps(error.body).decode())
    assert not any(_leaks(v) for v in error.response.headers.values())


async def test_the_openai_sdk_sees_only_listed_headers_on_an_answer(upstreams, proxy):
    async def ok(request: web.Request) -> web.StreamResponse:
        sent = _sent(request)
        return web.json_response(
            {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]},
            headers={"X-Debug-Auth": f"Bearer {sent}", "x-ratelimit-limit-requests": "100",
                     "x-ratelimit-remaining-tokens": f"5 {sent}", "request-id": "req_up", "server": "up/1.0"})

    up, p, access, _ = await _gateway(upstreams, proxy, "openai", {}, "/v1/chat/completions", ok)
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="client-key", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="chat", messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
        await access.close()
    headers = {k.lower(): v for k, v in raw.headers.items()}
    assert raw.parse().choices[0].message.content == "hi"
    assert headers["x-ratelimit-limit-requests"] == "100" and headers["request-id"] == "req_up"
    assert headers["x-ratelimit-remaining-tokens"] == "5 Bearer [redacted]"  # listed, and scrubbed
    assert "x-debug-auth" not in headers and headers.get("server") != "up/1.0"
    assert not any(_leaks(v) for v in headers.values())


def _asides(s: str) -> bytes:
    """What an SSE stream may carry besides its answer, each quoting the key: a comment, an ``id:``
    and a ``retry:`` line, and as an ``event:`` name no API uses."""
    return f": debug {s}\n\nid: {s}\nretry: 1000\nevent: {s}\n".encode()


def _with_asides(events: list[bytes]) -> Says:
    """``events`` with the asides before every one: in the held opening and after the commit."""
    return lambda s: b"".join(_asides(s) + event for event in events)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse(orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))


_ASIDE_CASES = [
    pytest.param("/v1/chat/completions", CHAT, "openai", {}, "/v1/chat/completions",
                 [_chunk({"role": "assistant"}), _chunk({"content": "hi"}), _chunk({"content": " there"}),
                  _chunk({}, "stop"), b"data: [DONE]\n\n"], id="chat-passthrough"),
    pytest.param("/v1/completions", COMPLETIONS, "openai", {}, "/v1/completions",
                 [sse(b'{"choices":[{"index":0,"text":"hi"}]}'), sse(b'{"choices":[{"index":0,"text":" there"}]}'),
                  b"data: [DONE]\n\n"], id="completions-passthrough"),
    pytest.param("/v1/messages", MESSAGES, "anthropic", {}, "/v1/messages",
                 [anthropic_event("message_start", {"message": {**message_body(), "content": []}}),
                  anthropic_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                  anthropic_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
                  anthropic_event("content_block_delta",
                                  {"index": 0, "delta": {"type": "text_delta", "text": " there"}}),
                  anthropic_event("message_stop", {})], id="messages-passthrough"),
    pytest.param("/v1/responses", RESPONSES, "openai", {"responses": True}, "/v1/responses",
                 [CREATED, responses_event("response.output_text.delta", delta="hi"),
                  responses_event("response.output_text.delta", delta=" there"),
                  responses_event("response.completed", response={"id": "r", "status": "completed"})],
                 id="responses-passthrough"),
]


@pytest.mark.parametrize(("path", "body", "kind", "extra", "upstream_path", "events"), _ASIDE_CASES)
async def test_a_key_in_sse_comments_or_id_lines_of_a_passthrough_stream_reaches_no_client(
        upstreams, proxy, path, body, kind, extra, upstream_path, events):
    """A reviewer's stream: the key in SSE comments, ``id:`` and ``retry:`` lines, both in the
    opening held back until the first token and after the commit. A passthrough stream is relayed as
    it is, and these lines went with it; now only ``data`` and ``event`` lines do, and a comment
    keeps its place as a bare ``:`` (a keep-alive is still one)."""
    handler = answer(_with_asides(events), stream=True)
    up, p, access, lines = await _gateway(upstreams, proxy, kind, extra, upstream_path, handler)
    status, _, answer_body = await _ask(p.url + path, {**body, "stream": True})
    await access.close()
    text = answer_body.decode()
    assert status == 200 and "hi" in text and " there" in text, text
    assert not _leaks(text), text
    assert "\nid:" not in text and "retry:" not in text and ":\n\n" in text, text

async def _sse_events(url: str) -> list[Any]:
    """The events aiohttp-sse-client reads of a streamed chat call, up to ``[DONE]`` (it keeps the last
    ``id:`` as ``last_event_id``, which it would send back on a reconnect)."""
    from aiohttp_sse_client.client import EventSource

    seen = []
    async with aiohttp.ClientSession() as session, EventSource(
            url + "/v1/chat/completions", option={"method": "POST"}, session=session, max_connect_retry=0,
            data=orjson.dumps({**CHAT, "stream": True})) as source:
        async for event in source:
            seen.append(event)
            if event.data == "[DONE]":
                break
    return seen

async def _sdk_words(url: str) -> list[str]:
    """The words the openai SDK reads of a streamed chat call (it splits lines as the SSE spec does)."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    try:
        stream = await client.chat.completions.create(**CHAT, stream=True)
        return [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    finally:
        await client.close()


async def test_an_sse_client_sees_no_key_as_the_last_event_id(upstreams, proxy):
    """aiohttp-sse-client keeps the last ``id:`` and would send it back as ``Last-Event-ID`` on a
    reconnect: a key there goes places. None reaches it."""
    handler = answer(_with_asides([_chunk({"role": "assistant"}), _chunk({"content": "hi"}), _chunk({}, "stop"),
                                   b"data: [DONE]\n\n"]), stream=True)
    up, p, access, _ = await _gateway(upstreams, proxy, "openai", {}, "/v1/chat/completions", handler)
    seen = await _sse_events(p.url)
    await access.close()
    assert [orjson.loads(e.data)["choices"][0]["delta"] for e in seen[:-1]] == [{"role": "assistant"},
                                                                                  {"content": "hi"}, {}]
    assert all(e.last_event_id == "" for e in seen), [e.last_event_id for e in seen]


def _bare_cr(event: bytes, key: str) -> bytes:
    """``event`` framed with lone CRs, as the WHATWG SSE spec lets an upstream end lines: its data line,
    then a comment and an ``id:`` line that quote the key, then a CR for the blank line."""
    return event.rstrip(b"\n") + b"\r: " + key.encode() + b"\rid: " + key.encode() + b"\rretry: 1\r\r"


def _lines(wire: bytes) -> list[bytes]:
    """The lines an SSE client reads (CRLF, LF or a lone CR ends one)."""
    return re.split(rb"\r\n|\r|\n", wire)


async def _after_the_first_token(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
        await asyncio.sleep(0.01)  # one read each: the lone-CR event arrives after the commit, on its own
    await response.write_eof()
    return response


_CR_CASES = [
    pytest.param("/v1/chat/completions", CHAT, "openai", "/v1/chat/completions",
                 lambda key: [_chunk({"role": "assistant"}), _chunk({"content": "hi"}),
                              _bare_cr(_chunk({"content": " there"}), key), _chunk({}, "stop"), b"data: [DONE]\n\n"],
                 id="chat-passthrough"),
    pytest.param("/v1/messages", MESSAGES, "anthropic", "/v1/messages",
                 lambda key: [anthropic_event("message_start", {"message": {**message_body(), "content": []}}),
                              anthropic_event("content_block_start",
                                              {"index": 0, "content_block": {"type": "text", "text": ""}}),
                              anthropic_event("content_block_delta",
                                              {"index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
                              _bare_cr(anthropic_event("content_block_delta", {
                                  "index": 0, "delta": {"type": "text_delta", "text": " there"}}), key),
                              anthropic_event("content_block_stop", {"index": 0}),
                              anthropic_event("message_stop", {})],
                 id="messages-passthrough"),
]


@pytest.mark.parametrize(("path", "body", "kind", "upstream_path", "events"), _CR_CASES)
async def test_lone_crs_end_lines_for_the_filter_as_they_do_for_the_client(upstreams, proxy, path, body, kind,
                                                                          upstream_path, events):
    """A reviewer's stream: after the first token, ``data: {...}\\r: key\\rid: key\\r\\r``. firstbyte read
    lines up to LF, so the whole event was one data line to its filter and went on as it was; an SSE client
    (WHATWG: CRLF, LF or CR ends a line) read the comment and the ``id:`` line the filter drops. A lone CR
    is an LF now: the client gets only the lines the filter keeps, and the answer whole."""
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _after_the_first_token(request, events(_sent(request)))

    up, p, access, _ = await _gateway(upstreams, proxy, kind, {}, upstream_path, handler)
    status, _, wire = await _ask(p.url + path, {**body, "stream": True})
    await access.close()
    assert status == 200, wire
    assert not _leaks(wire.decode()), wire
    kept = [line for line in _lines(wire) if line and not line.startswith((b"data:", b"event:"))]
    assert set(kept) <= {b":"}, kept
    assert b" there" in wire, wire


async def test_an_sse_client_reads_no_key_from_a_lone_cr_event(upstreams, proxy):
    """aiohttp-sse-client splits lines at LF only (its StreamReader's lines): the lone-CR event was one data
    line to it, the key inside its data. The openai SDK splits as the spec does and read the same words."""
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _after_the_first_token(request, [
            _chunk({"role": "assistant"}), _chunk({"content": "hi"}),
            _bare_cr(_chunk({"content": " there"}), _sent(request)), _chunk({}, "stop"), b"data: [DONE]\n\n"])

    up, p, access, _ = await _gateway(upstreams, proxy, "openai", {}, "/v1/chat/completions", handler)
    seen = await _sse_events(p.url)
    assert not any(_leaks(e.data) or _leaks(e.last_event_id) for e in seen), seen
    assert "".join(orjson.loads(e.data)["choices"][0]["delta"].get("content", "") for e in seen[:-1]) == "hi there"
    words = await _sdk_words(p.url)
    await access.close()
    assert "".join(words) == "hi there"


async def test_a_stream_framed_by_lone_crs_alone_is_answered(upstreams, proxy):
    """Every line of the stream ended by a lone CR, as the spec allows: the first-token gate found no event
    in it and failed the stream as empty (a 502). It reads the events an SSE client reads now."""
    async def handler(request: web.Request) -> web.StreamResponse:
        events = [_chunk({"role": "assistant"}), _chunk({"content": "hi"}), _chunk({"content": " there"}),
                  _chunk({}, "stop"), b"data: [DONE]\n\n"]
        return await _after_the_first_token(request, [event.replace(b"\n", b"\r") for event in events])

    up, p, access, _ = await _gateway(upstreams, proxy, "openai", {}, "/v1/chat/completions", handler)
    words = await _sdk_words(p.url)
    await access.close()
    assert "".join(words) == "hi there"
