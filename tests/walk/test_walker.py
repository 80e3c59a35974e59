"""Upstream answers that claim success and are not: a buffered 2xx that is not JSON, usage whose counts
are strings. Each used to be a 500 after the walk; now the first fails over (and the breaker hears a
failure), the second is answered, logged and stored."""

from __future__ import annotations

import asyncio
import contextlib
import io
import sqlite3

import orjson
import pytest
from aiohttp import web

from proxy.bounds import MAX_CHUNK_DEPTH
from proxy.config import AccessLog as AccessLogConfig
from proxy.observe.accesslog import AccessLog
from proxy.observe.ledger import Ledger
from proxy.server.request import parse_call
from proxy.walk.result import Committed

from ..anthropic_fakes import anthropic_provider, message_body
from ..conftest import (
    chat_answered,
    chat_body,
    chat_refused,
    chunk_event,
    decision_of,
    ok_handler,
    openai_provider,
    route_config,
)

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<html><body>502 Bad Gateway</body></html>", id="html"),
        pytest.param(b'{"id": "chatcmpl-1", "choices": [', id="cut-json"),
        pytest.param(b"[1, 2, 3]", id="json-but-not-an-object"),
    ],
)
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_buffered_2xx_that_is_not_json_fails_over_and_counts(upstreams, proxy, body, kind):
    async def liar(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, status=200, content_type="application/json")

    bad = await upstreams({"*": liar})
    good = await upstreams({"/v1/chat/completions": ok_handler("fine")})
    providers = {"bad": anthropic_provider(bad.url) if kind == "anthropic" else openai_provider(bad.url),
                 "good": openai_provider(good.url)}
    p = await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                 providers))
    status, headers, answer = await p.post("/v1/chat/completions", CHAT)
    assert status == 200, answer
    assert orjson.loads(answer)["choices"][0]["message"]["content"] == "fine"
    decision = decision_of(headers)
    assert decision.attempt_outcomes() == [("bad", "invalid body"), ("good", "200")]
    bad_state = p.gateway.state.target(("bad", "m"))
    assert bad_state.breaker.health(p.gateway.clock()).failures == 1  # told the truth, not a success
    assert p.gateway.state.tracker.samples(("bad", "m")) == 0  # and no figure from a failure


async def test_a_lone_target_answering_garbage_is_a_502_in_the_openai_shape(upstreams, proxy):
    async def liar(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"not json", status=200)

    bad = await upstreams({"*": liar})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}], {"bad": openai_provider(bad.url)}))
    status, _, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 502
    assert orjson.loads(body)["error"]["code"] == "invalid_body"


@pytest.mark.parametrize(
    ("kind", "path", "usage", "stream"),
    [
        pytest.param("openai", "/v1/chat/completions", {"prompt_tokens": "7", "completion_tokens": "many"}, False,
                     id="openai-buffered"),
        pytest.param("anthropic", "/v1/chat/completions", {"input_tokens": "7", "output_tokens": None}, False,
                     id="anthropic-buffered"),
        pytest.param("anthropic", "/v1/messages", {"input_tokens": "7", "output_tokens": [1]}, False,
                     id="anthropic-messages"),
        pytest.param("openai", "/v1/messages", {"prompt_tokens": "7", "completion_tokens": {"x": 1}}, False,
                     id="openai-reverse"),
        pytest.param("openai", "/v1/messages", {"prompt_tokens": "7", "completion_tokens": "x"}, True,
                     id="openai-reverse-streamed"),
    ],
)
async def test_usage_with_string_counts_is_answered_logged_and_stored(upstreams, proxy, tmp_path, kind, path,
                                                                      usage, stream):
    async def odd(request: web.Request) -> web.StreamResponse:
        if kind == "anthropic":
            return web.json_response({**message_body(), "usage": usage})
        if stream:
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            tail = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                    "usage": usage}
            await response.write(b"data: " + orjson.dumps(tail) + b"\n\ndata: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response({**chat_body(), "usage": usage})

    up = await upstreams({"*": odd})
    provider = anthropic_provider(up.url) if kind == "anthropic" else openai_provider(up.url)
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    ledger = Ledger(str(tmp_path / "ledger.db"), retention_days=30, queue_size=100)
    await ledger.start()
    p = await proxy(route_config([{"provider": "up", "model": "m", "price": {"input": 1, "output": 1}}],
                                 {"up": provider}), observers=[access, ledger])
    body = {**CHAT, "max_tokens": 5, "stream": stream}
    status, headers, answer = await p.post(path, body)
    await access.close()
    await ledger.close()
    assert status == 200, answer
    rid = decision_of(headers).id
    logged = [orjson.loads(line) for line in lines.getvalue().splitlines()]
    assert [line["id"] for line in logged] == [rid]
    assert logged[0]["prompt_tokens"] == 7
    conn = sqlite3.connect(ledger.path)
    rows = conn.execute("SELECT id, prompt_tokens FROM decisions").fetchall()
    conn.close()
    assert rows == [(rid, 7)]


MESSAGES = {"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "chat", "input": "hi"}


@pytest.mark.parametrize(("kind", "path", "request_body", "answer"), [
    pytest.param("openai", "/v1/messages", MESSAGES, {"choices": [5]}, id="messages-choices-of-ints"),
    pytest.param("openai", "/v1/messages", MESSAGES,
                 {"choices": [{"message": {"content": "x", "tool_calls": 5}}]}, id="messages-tool-calls-int"),
    pytest.param("openai", "/v1/messages", MESSAGES, {"choices": {"a": 1}}, id="messages-choices-a-mapping"),
    pytest.param("openai", "/v1/responses", RESPONSES, {"choices": [5]}, id="responses-choices-of-ints"),
    pytest.param("openai", "/v1/responses", RESPONSES,
                 {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "a"}},
                 id="responses-usage-a-string"),
    pytest.param("anthropic", "/v1/chat/completions", CHAT,
                 {"content": [{"type": "text"}, {"type": "tool_use"}, 5], "usage": None}, id="chat-content-int"),
])
async def test_a_2xx_whose_fields_have_the_wrong_types_is_an_invalid_body_not_a_500(
        upstreams, proxy, kind, path, request_body, answer):
    """A reviewer's upstream answers: the right envelope, fields of the wrong types. Each crashed a
    translator into a 500 with a traceback; the upstream failed, so it is a 502 and counts."""
    async def liar(request: web.Request) -> web.StreamResponse:
        return web.json_response(answer)

    bad = await upstreams({"*": liar})
    provider = anthropic_provider(bad.url) if kind == "anthropic" else openai_provider(bad.url)
    p = await proxy(route_config([{"provider": "bad", "model": "m"}], {"bad": provider}))
    status, headers, body = await p.post(path, request_body)
    assert status == 502, body
    assert decision_of(headers).attempt_outcomes() == [("bad", "invalid body")]
    assert p.gateway.state.target(("bad", "m")).breaker.health(p.gateway.clock()).failures == 1


def _events(*payloads: dict[str, object]) -> bytes:
    """Named SSE events (Anthropic's and the Responses API's shape), each named after its ``type``."""
    return b"".join(b"event: %s\ndata: %s\n\n" % (str(p["type"]).encode(), orjson.dumps(p)) for p in payloads)


_START = {"type": "message_start", "message": {"id": "m", "role": "assistant", "content": [],
                                               "usage": {"input_tokens": 1, "output_tokens": 0}}}
_TEXT = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}


@pytest.mark.parametrize(("kind", "path", "request_body", "opening"), [
    pytest.param("openai", "/v1/messages", MESSAGES, b'data: {"choices":[{"delta":{"tool_calls":5}}]}\n\n',
                 id="openai-to-messages-tool-calls-int"),
    pytest.param("openai", "/v1/messages", MESSAGES,
                 b'data: {"choices":[{"delta":{"role":"assistant"}}],"usage":5}\n\n'
                 b'data: {"choices":[5,{"delta":{"content":"hi"}}]}\n\n', id="openai-to-messages-choice-int"),
    pytest.param("anthropic", "/v1/chat/completions", CHAT,
                 _events(_START, {"type": "content_block_start", "index": [1],
                                  "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}),
                 id="anthropic-to-chat-index-a-list"),
    pytest.param("anthropic", "/v1/chat/completions", CHAT,
                 _events(_START, {"type": "content_block_delta", "index": 0, "delta": "x"}, _TEXT),
                 id="anthropic-to-chat-held-delta-a-string"),
    pytest.param("openai", "/v1/responses", RESPONSES, b'data: {"choices":[{"delta":{"tool_calls":[5]}}]}\n\n',
                 id="openai-to-responses-tool-call-int"),
])
async def test_a_stream_opening_whose_fields_have_the_wrong_types_fails_over_before_the_commit(
        upstreams, proxy, kind, path, request_body, opening):
    """A reviewer's streams: the first token came, but an event up to it (held back, or the token's
    own) has fields of the wrong types. Nothing has reached the client yet, so it is the upstream's
    malformed stream: counted, and the next target answers. (It used to commit, then end in
    ``stream_interrupted`` quoting Python's error text.)"""
    async def liar(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(opening)
        await response.write_eof()
        return response

    bad = await upstreams({"*": liar})
    good = await upstreams({"/v1/chat/completions": ok_handler("fine")})
    provider = anthropic_provider(bad.url) if kind == "anthropic" else openai_provider(bad.url)
    p = await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                 {"bad": provider, "good": openai_provider(good.url)}))
    status, headers, body = await p.post(path, {**request_body, "stream": True})
    assert status == 200, body
    assert b"fine0" in body and b"Error" not in body, body
    assert decision_of(headers).attempt_outcomes() == [("bad", "malformed stream"), ("good", "200")]
    assert p.gateway.state.target(("bad", "m")).breaker.health(p.gateway.clock()).failures == 1
    assert p.gateway.state.tracker.samples(("bad", "m"), "streamed") == 0


async def test_a_lone_target_whose_stream_opening_has_the_wrong_types_is_a_502_a_person_can_read(upstreams, proxy):
    async def liar(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"delta":{"tool_calls":5}}]}\n\n')
        await response.write_eof()
        return response

    bad = await upstreams({"*": liar})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}], {"bad": openai_provider(bad.url)}))
    status, _, body = await p.post("/v1/messages", {**MESSAGES, "stream": True})
    assert status == 502, body
    message = orjson.loads(body)["error"]["message"]
    assert "wrong types" in message and "Error" not in message and "iterable" not in message, message


@pytest.mark.parametrize(
    ("stream", "status", "ran"),
    [
        pytest.param(True, 200, [True], id="stream-2xx-runs-before-its-first-token"),
        pytest.param(False, 200, [], id="buffered-has-no-head-to-wait-behind"),
        pytest.param(True, 503, [], id="a-refusal-is-no-head-to-wait-behind"),
    ],
)
async def test_the_servers_work_for_meanwhile_runs_at_a_2xx_streams_head_before_its_first_token(
        upstreams, proxy, stream, status, ran):
    """``Call.meanwhile`` (the header's planned part, in the server) runs while the upstream thinks:
    at a 2xx stream's head, before the first token is even sent, so the commit does not wait for it."""
    token_sent = asyncio.Event()
    may_send = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        if status != 200:
            return web.json_response({"error": {"message": "busy"}}, status=status)
        if not stream:
            return web.json_response(chat_body("fine"))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": thinking\n\n")
        with contextlib.suppress(TimeoutError):  # without the hook nobody says so: the token comes anyway
            await asyncio.wait_for(may_send.wait(), 1.0)
        token_sent.set()
        await response.write(chunk_event("hi") + chunk_event("", "stop") + b"data: [DONE]\n\n")
        return response

    up = await upstreams({"/v1/chat/completions": slow})
    p = await proxy(route_config([{"provider": "a", "model": "m"}], {"a": openai_provider(up.url)}))
    config, walker = p.gateway.config, p.gateway.walker
    assert walker is not None
    seen: list[bool] = []

    def meanwhile() -> None:
        seen.append(not token_sent.is_set())
        may_send.set()

    call, _ = parse_call("chat", orjson.dumps({**CHAT, "stream": stream}))
    call.meanwhile = meanwhile
    if not stream:
        may_send.set()
    route = config.routes["chat"]
    walked = await walker.walk(route, route.targets, call, config.providers)
    if isinstance(walked, Committed):
        walked.lease.finish()
    assert seen == ran


def _nested(levels: int, pad: int = 0) -> bytes:
    """A chat answer whose JSON nests ``levels`` deep (its own object is the first), its text ``pad``
    bytes long: past ``FULL_JSON_CHECK`` only the answer's shape was looked at."""
    answer = orjson.dumps({**chat_body("x" * pad if pad else "deep"), "x": None})
    return answer.replace(b'"x":null', b'"x":' + b"[" * (levels - 1) + b"]" * (levels - 1))


DEEP_ANSWERS = [pytest.param(_nested(1020), id="1020-levels-orjson-reads"),
                pytest.param(_nested(5000, pad=1_100_000), id="5000-levels-past-the-full-check")]


@pytest.mark.parametrize("answer", DEEP_ANSWERS)
async def test_a_buffered_answer_nested_past_a_clients_parser_fails_over(upstreams, proxy, answer):
    """A reviewer's answers: orjson read the first (1,024 levels), the second was too large to be
    parsed, so both were relayed and the openai SDK raised RecursionError in the application. Nothing
    was sent yet: the next target answers, and the deep one counts as failed."""
    async def deep(request: web.Request) -> web.StreamResponse:
        return web.Response(body=answer, content_type="application/json")

    bad = await upstreams({"*": deep})
    good = await upstreams({"/v1/chat/completions": ok_handler("fine")})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                 {"bad": openai_provider(bad.url), "good": openai_provider(good.url)}))
    content, headers = await chat_answered(p)
    assert content == "fine"
    assert decision_of(headers).attempt_outcomes() == [("bad", "invalid body"), ("good", "200")]
    assert p.gateway.state.target(("bad", "m")).breaker.health(p.gateway.clock()).failures == 1


@pytest.mark.parametrize("answer", DEEP_ANSWERS)
async def test_a_lone_target_nesting_past_a_clients_parser_is_a_502_the_sdk_reads(upstreams, proxy, answer):
    async def deep(request: web.Request) -> web.StreamResponse:
        return web.Response(body=answer, content_type="application/json")

    bad = await upstreams({"*": deep})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}], {"bad": openai_provider(bad.url)}))
    refused = await chat_refused(p)
    assert refused.status_code == 502
    assert f"nested more than {MAX_CHUNK_DEPTH} levels deep" in refused.message, refused.message


async def test_an_answer_nested_to_the_limit_is_relayed(upstreams, proxy):
    """512 levels, the limit (what a client's parser reads with room to spare), goes to the client."""
    answer = _nested(MAX_CHUNK_DEPTH)

    async def deep(request: web.Request) -> web.StreamResponse:
        return web.Response(body=answer, content_type="application/json")

    up = await upstreams({"*": deep})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    status, _, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 200 and body == answer
