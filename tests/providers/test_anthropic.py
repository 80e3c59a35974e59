"""The ``kind: anthropic`` adapter end to end: OpenAI clients, a fake Anthropic upstream over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from ..anthropic_fakes import (
    OVERLOADED,
    USAGE_IN,
    USAGE_OUT,
    anthropic_error,
    anthropic_provider,
    event,
    messages_handler,
    text_events,
)
from ..conftest import decision_of, ok_handler, openai_provider, route_config

CHAT = {"model": "chat", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "hi"}]}


@pytest.fixture
async def oai():
    clients: list[openai.AsyncOpenAI] = []

    def make(url: str) -> openai.AsyncOpenAI:
        clients.append(openai.AsyncOpenAI(base_url=url + "/v1", api_key="client-secret", max_retries=0))
        return clients[-1]

    yield make
    for c in clients:
        await c.close()


async def anthropic_route(upstreams, proxy, handler, **provider: Any):
    up = await upstreams({"/v1/messages": handler})
    providers = {"claude": anthropic_provider(up.url, api_key_env="ANTHROPIC_KEY", **provider)}
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}], providers),
                    env={"ANTHROPIC_KEY": "sk-ant"})
    return up, p


def sse_payloads(raw: bytes) -> list[Any]:
    out = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            data = block[6:]
            out.append(data.decode() if data == b"[DONE]" else orjson.loads(data))
    return out


async def test_buffered_chat_is_translated_both_ways(upstreams, proxy, oai):
    up, p = await anthropic_route(upstreams, proxy, messages_handler("Hello!"), default_max_tokens=333)
    raw = await oai(p.url).chat.completions.with_raw_response.create(**CHAT)
    completion = raw.parse()
    assert completion.choices[0].message.content == "Hello!"
    assert completion.choices[0].finish_reason == "stop"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (USAGE_IN, USAGE_OUT)
    sent = up.calls[0]
    assert sent["path"] == "/v1/messages"
    assert sent["headers"]["x-api-key"] == "sk-ant"
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in sent["headers"]
    assert sent["json"] == {"model": "claude-x", "system": "Be brief.", "max_tokens": 333,
                            "messages": [{"role": "user", "content": "hi"}]}
    assert decision_of(dict(raw.headers)).attempt_outcomes() == [("claude", "200")]


async def test_stream_is_translated_event_by_event_with_ping(upstreams, proxy, oai):
    _, p = await anthropic_route(upstreams, proxy, messages_handler(words=["Hel", "lo", "!"]))
    stream = await oai(p.url).chat.completions.create(**CHAT, stream=True)
    chunks = [c async for c in stream]
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts == ["Hel", "lo", "!"]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in chunks)  # the client did not ask for usage


async def test_stream_usage_chunk_when_the_client_asks(upstreams, proxy):
    _, p = await anthropic_route(upstreams, proxy, messages_handler())
    status, _, body = await p.post("/v1/chat/completions",
                                   {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    payloads = sse_payloads(body)
    assert status == 200 and payloads[-1] == "[DONE]"
    assert payloads[-2]["usage"] == {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT,
                                     "total_tokens": USAGE_IN + USAGE_OUT}


async def test_first_chunk_reaches_the_client_before_the_answer_ends(upstreams, proxy):
    release = asyncio.Event()
    events = text_events(["one", "two"])

    async def held(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for piece in events[:4]:  # message_start .. first delta
            await response.write(piece)
        await release.wait()
        for piece in events[4:]:
            await response.write(piece)
        await response.write_eof()
        return response

    up = await upstreams({"/v1/messages": held})
    p = await proxy(route_config([{"provider": "c", "model": "m"}], {"c": anthropic_provider(up.url)}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        stream = await client.chat.completions.create(**CHAT, stream=True)
        texts = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                texts.append(chunk.choices[0].delta.content)
                release.set()  # only now may the upstream go on
        assert texts == ["one", "two"]
    finally:
        await client.close()


async def test_error_event_mid_stream_ends_the_client_stream_with_an_error(upstreams, proxy):
    events = [*text_events(["partial"])[:4], OVERLOADED]
    _, p = await anthropic_route(upstreams, proxy, messages_handler(events=events))
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    payloads = sse_payloads(body)
    assert status == 200
    assert payloads[1]["choices"][0]["delta"]["content"] == "partial"
    assert payloads[-1]["error"]["code"] == "stream_interrupted"
    assert "Overloaded" in payloads[-1]["error"]["message"]
    assert "[DONE]" not in payloads
    assert p.gateway.state.success_share(("claude", "claude-x")) == 0.5  # commit, then a failure


async def test_cut_connection_mid_stream_ends_with_an_error(raw_upstreams, proxy):
    events = b"".join(text_events(["cut"])[:4])

    async def script(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(f"{len(events):x}\r\n".encode() + events + b"\r\n")
        await writer.drain()
        writer.close()  # no terminating chunk: the connection is cut

    up = await raw_upstreams(script)
    p = await proxy(route_config([{"provider": "c", "model": "m"}], {"c": anthropic_provider(up.url)}))
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    payloads = sse_payloads(body)
    assert status == 200
    assert payloads[1]["choices"][0]["delta"]["content"] == "cut"
    assert payloads[-1]["error"]["code"] == "stream_interrupted"


async def test_stream_ending_without_message_stop_is_an_error(upstreams, proxy):
    _, p = await anthropic_route(upstreams, proxy, messages_handler(events=text_events(["x"])[:4]))
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    payloads = sse_payloads(body)
    assert status == 200 and "end marker" in payloads[-1]["error"]["message"]


async def test_529_fails_over_to_an_openai_target_in_one_request(upstreams, proxy, oai):
    claude = await upstreams({"/v1/messages": anthropic_error(529, "overloaded_error", "Overloaded")})
    gpt = await upstreams({"/v1/chat/completions": ok_handler("from-openai")})
    config = route_config(
        [{"provider": "claude", "model": "claude-x"}, {"provider": "gpt", "model": "gpt-x"}],
        {"claude": anthropic_provider(claude.url), "gpt": openai_provider(gpt.url)},
    )
    p = await proxy(config)
    raw = await oai(p.url).chat.completions.with_raw_response.create(**CHAT)
    assert raw.parse().choices[0].message.content == "from-openai"
    d = decision_of(dict(raw.headers))
    assert d.attempt_outcomes() == [("claude", "529"), ("gpt", "200")]
    assert d.served == "gpt"
    assert gpt.calls[0]["json"]["messages"] == CHAT["messages"]


async def test_prompt_too_long_is_a_context_overflow(upstreams, proxy):
    claude = await upstreams({"/v1/messages": anthropic_error(
        400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")})
    gpt = await upstreams({"/v1/chat/completions": ok_handler("big-window")})
    config = route_config(
        [{"provider": "claude", "model": "claude-x"}, {"provider": "gpt", "model": "gpt-x"}],
        {"claude": anthropic_provider(claude.url), "gpt": openai_provider(gpt.url)},
    )
    p = await proxy(config)
    status, headers, _ = await p.post("/v1/chat/completions", CHAT)
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("claude", "400 context overflow"), ("gpt", "200")]


async def test_other_400_comes_back_in_the_openai_shape(upstreams, proxy, oai):
    _, p = await anthropic_route(upstreams, proxy, anthropic_error(400, "invalid_request_error", "bad temperature"))
    with pytest.raises(openai.BadRequestError) as info:
        await oai(p.url).chat.completions.create(**CHAT)
    assert info.value.body["message"] == "bad temperature"
    assert info.value.body["type"] == "invalid_request_error"


async def test_all_failed_error_is_normalised(upstreams, proxy):
    _, p = await anthropic_route(upstreams, proxy, anthropic_error(529, "overloaded_error", "Overloaded"))
    status, _, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 529
    assert orjson.loads(body)["error"] == {"message": "Overloaded", "type": "overloaded_error",
                                           "param": None, "code": None}


async def test_untranslatable_request_moves_on_without_counting_against_the_target(upstreams, proxy):
    claude = await upstreams({"/v1/messages": messages_handler()})
    gpt = await upstreams({"/v1/chat/completions": ok_handler("two-choices")})
    config = route_config(
        [{"provider": "claude", "model": "claude-x"}, {"provider": "gpt", "model": "gpt-x"}],
        {"claude": anthropic_provider(claude.url), "gpt": openai_provider(gpt.url)},
    )
    p = await proxy(config)
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "n": 2})
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("claude", "untranslatable"), ("gpt", "200")]
    assert claude.calls == []
    assert p.gateway.state.success_share(("claude", "claude-x")) is None


async def test_untranslatable_request_alone_is_a_clear_400(upstreams, proxy):
    up, p = await anthropic_route(upstreams, proxy, messages_handler())
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "n": 3})
    assert status == 400
    error = orjson.loads(body)["error"]
    assert error["code"] == "untranslatable" and "n > 1" in error["message"]
    assert decision_of(headers).attempt_outcomes() == [("claude", "untranslatable")]
    assert up.calls == []


async def test_embeddings_are_not_sent_to_an_anthropic_target(upstreams, proxy):
    _, p = await anthropic_route(upstreams, proxy, messages_handler())
    status, _, body = await p.post("/v1/embeddings", {"model": "chat", "input": "x"})
    assert status == 400 and "embeddings" in orjson.loads(body)["error"]["message"]


async def test_tool_use_stream_becomes_tool_calls(upstreams, proxy):
    start = text_events([])[0]
    events = [
        start,
        event("content_block_start", {"index": 0, "content_block": {
            "type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}}),
        event("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"city"'}}),
        event("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": ':"Oslo"}'}}),
        event("content_block_stop", {"index": 0}),
        event("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        event("message_stop", {}),
    ]
    _, p = await anthropic_route(upstreams, proxy, messages_handler(events=events))
    _, _, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    payloads = sse_payloads(body)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in payloads[:-1]
             if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["id"] == "toolu_1" and calls[0]["function"]["name"] == "weather"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city":"Oslo"}'
    assert payloads[-2]["choices"][0]["finish_reason"] == "tool_calls"
