"""``POST /v1/messages``: the anthropic SDK through firstbyte to Anthropic and OpenAI fakes."""

from __future__ import annotations

import anthropic
import orjson
import pytest
from aiohttp import web

from .anthropic_fakes import (
    USAGE_IN,
    USAGE_OUT,
    anthropic_error,
    anthropic_provider,
    messages_handler,
    text_events,
)
from .conftest import chunk_event, decision_of, ok_handler, openai_provider, route_config, sse, status_handler

ASK = {"model": "chat", "max_tokens": 100, "system": "Be brief.",
       "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def sdk():
    clients: list[anthropic.AsyncAnthropic] = []

    def make(url: str) -> anthropic.AsyncAnthropic:
        clients.append(anthropic.AsyncAnthropic(base_url=url, api_key="client-key", max_retries=0))
        return clients[-1]

    yield make
    for c in clients:
        await c.close()


async def to_anthropic(upstreams, proxy, handler=None):
    up = await upstreams({"/v1/messages": handler or messages_handler("Hello!")})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}],
                                 {"claude": anthropic_provider(up.url)}))
    return up, p


async def to_openai(upstreams, proxy, handler=None):
    up = await upstreams({"/v1/chat/completions": handler or ok_handler("from-gpt", chunks=3)})
    p = await proxy(route_config([{"provider": "gpt", "model": "gpt-x"}], {"gpt": openai_provider(up.url)}))
    return up, p


async def test_buffered_to_anthropic_goes_as_it_is(upstreams, proxy, sdk):
    up, p = await to_anthropic(upstreams, proxy)
    raw = await sdk(p.url).messages.with_raw_response.create(**ASK)
    message = await raw.parse()
    assert message.content[0].text == "Hello!"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (USAGE_IN, USAGE_OUT)
    assert up.calls[0]["json"] == {**ASK, "model": "claude-x"}
    assert decision_of(dict(raw.headers)).served == "claude"


async def test_anthropic_beta_reaches_anthropic_but_the_client_key_does_not(upstreams, proxy, sdk):
    up, p = await to_anthropic(upstreams, proxy)
    await sdk(p.url).messages.create(**ASK, extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"})
    sent = {k.lower(): v for k, v in up.calls[0]["headers"].items()}
    assert sent["anthropic-beta"] == "prompt-caching-2024-07-31"
    assert "client-key" not in sent.values()


async def test_streamed_to_anthropic_goes_event_by_event(upstreams, proxy, sdk):
    _, p = await to_anthropic(upstreams, proxy, messages_handler(words=["Hel", "lo"]))
    async with sdk(p.url).messages.stream(**ASK) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert texts == ["Hel", "lo"]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == USAGE_OUT


def odd_named(events: list[bytes], at: int, name: bytes) -> list[bytes]:
    """``events`` with the one at ``at`` sent under ``event: name`` instead of its own name."""
    return [*events[:at], b"event: " + name + events[at][events[at].index(b"\n"):], *events[at + 1:]]


@pytest.mark.parametrize(("at", "name"), [
    pytest.param(3, b"X-SECRET-sk-ant-0123", id="the-first-text-under-a-name-no-api-uses"),
    pytest.param(5, b"X-SECRET-sk-ant-0123", id="a-later-text-under-a-name-no-api-uses"),
    pytest.param(4, b"Content_Block_Delta\r", id="a-later-text-capitalised-crlf"),
])
async def test_an_anthropic_event_under_an_odd_name_keeps_its_text(upstreams, proxy, sdk, at, name):
    """The name is dropped (it may carry anything: a key), and the SDK reads an event by its name, so an
    unnamed ``content_block_delta`` was ignored and its text lost silently. It is named by its data's
    type, as Anthropic names every event; the name itself never reaches the client."""
    events = odd_named(text_events(["Hel", "lo", " there"]), at, name)
    up = await upstreams({"/v1/messages": messages_handler(events=events)})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}], {"claude": anthropic_provider(up.url)}))
    async with sdk(p.url).messages.stream(**ASK) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Hello there" and final.content[0].text == "Hello there"
    raw = await sdk(p.url).messages.with_raw_response.create(**ASK, stream=True)
    body = b"".join([chunk async for chunk in raw.http_response.aiter_bytes()])
    assert b"SECRET" not in body and b"Content_Block" not in body and body.count(b"event: content_block_delta") == 3


async def test_buffered_to_openai_goes_through_the_reverse_translation(upstreams, proxy, sdk):
    up, p = await to_openai(upstreams, proxy)
    message = await sdk(p.url).messages.create(**ASK)
    assert message.content[0].text == "from-gpt"
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 1)
    assert up.calls[0]["path"] == "/v1/chat/completions"
    assert up.calls[0]["json"]["messages"] == [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "hi"}]
    assert up.calls[0]["json"]["model"] == "gpt-x"


async def test_streamed_to_openai_goes_event_by_event(upstreams, proxy, sdk):
    async def with_usage(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stream_options"] == {"include_usage": True}
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for piece in (chunk_event("a"), chunk_event("b"), chunk_event("", "length")):
            await response.write(piece)
        await response.write(sse({"id": "c", "object": "chat.completion.chunk", "choices": [],
                                  "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    _, p = await to_openai(upstreams, proxy, with_usage)
    async with sdk(p.url).messages.stream(**ASK) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert texts == ["a", "b"]
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 2


async def test_failover_across_kinds_on_messages(upstreams, proxy, sdk):
    claude = await upstreams({"/v1/messages": anthropic_error(529, "overloaded_error", "Overloaded")})
    gpt = await upstreams({"/v1/chat/completions": ok_handler("rescued")})
    p = await proxy(route_config(
        [{"provider": "claude", "model": "claude-x"}, {"provider": "gpt", "model": "gpt-x"}],
        {"claude": anthropic_provider(claude.url), "gpt": openai_provider(gpt.url)},
    ))
    raw = await sdk(p.url).messages.with_raw_response.create(**ASK)
    assert (await raw.parse()).content[0].text == "rescued"
    assert decision_of(dict(raw.headers)).attempt_outcomes() == [("claude", "529"), ("gpt", "200")]


async def test_unknown_route_is_an_anthropic_not_found(upstreams, proxy, sdk):
    _, p = await to_anthropic(upstreams, proxy)
    with pytest.raises(anthropic.NotFoundError) as info:
        await sdk(p.url).messages.create(**{**ASK, "model": "nope"})
    assert info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == "not_found_error"


async def test_bad_json_is_an_anthropic_invalid_request(upstreams, proxy):
    _, p = await to_anthropic(upstreams, proxy)
    status, _, body = await p.post("/v1/messages", b"{not json")
    assert status == 400
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def test_nothing_eligible_is_an_anthropic_overloaded_with_the_decision(upstreams, proxy):
    up = await upstreams({"/v1/messages": messages_handler()})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}],
                                 {"claude": anthropic_provider(up.url, api_key_env="UNSET_KEY")}))
    status, headers, body = await p.post("/v1/messages", ASK)
    assert status == 503
    assert orjson.loads(body)["error"]["type"] == "overloaded_error"
    assert decision_of(headers).excluded_reason("claude") == "no credentials"


async def test_upstream_errors_keep_or_take_the_anthropic_shape(upstreams, proxy, sdk):
    _, p = await to_anthropic(upstreams, proxy, anthropic_error(400, "invalid_request_error", "bad field"))
    with pytest.raises(anthropic.BadRequestError) as info:
        await sdk(p.url).messages.create(**ASK)
    assert info.value.body["error"] == {"type": "invalid_request_error", "message": "bad field"}

    _, p = await to_openai(upstreams, proxy, status_handler(422, "unprocessable"))
    with pytest.raises(anthropic.UnprocessableEntityError) as info2:
        await sdk(p.url).messages.create(**ASK)
    assert info2.value.body["error"]["message"] == "unprocessable"


async def test_client_key_refusal_is_in_the_anthropic_shape(upstreams, proxy):
    up = await upstreams({"/v1/messages": messages_handler()})
    raw = route_config([{"provider": "claude", "model": "claude-x"}], {"claude": anthropic_provider(up.url)})
    raw["clients"] = {"keys_env": "FB_KEYS"}
    p = await proxy(raw, env={"FB_KEYS": "good"})
    status, _, body = await p.post("/v1/messages", ASK, {"x-api-key": "bad"})
    assert status == 401
    assert orjson.loads(body)["error"]["type"] == "authentication_error"
    status, _, _ = await p.post("/v1/messages", ASK, {"x-api-key": "good"})
    assert status == 200


async def test_error_event_mid_stream_reaches_the_sdk(upstreams, proxy, sdk):
    from .anthropic_fakes import OVERLOADED

    events = [*text_events(["so"])[:4], OVERLOADED]
    _, p = await to_anthropic(upstreams, proxy, messages_handler(events=events))
    texts = []
    with pytest.raises(anthropic.APIStatusError):
        async with sdk(p.url).messages.stream(**ASK) as stream:
            async for text in stream.text_stream:
                texts.append(text)
    assert texts == ["so"]


async def test_openai_stream_cut_before_finish_ends_with_an_anthropic_error_event(upstreams, proxy):
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("half"))
        await response.write_eof()
        return response

    _, p = await to_openai(upstreams, proxy, cut)
    status, _, body = await p.post("/v1/messages", {**ASK, "stream": True})
    assert status == 200
    assert b"event: error" in body and b"end marker" in body
    assert b'"text":"half"' in body


async def test_simulated_target_answers_messages(proxy, sdk):
    raw = {"providers": {"sim": {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0,
                                                                   "chunk_ms": 0, "chunks": 3}}},
           "routes": {"chat": {"targets": [{"provider": "sim", "model": "sim-1"}]}}}
    p = await proxy(raw)
    message = await sdk(p.url).messages.create(**ASK)
    assert message.content[0].text and message.usage.output_tokens == 3
    async with sdk(p.url).messages.stream(**ASK) as stream:
        texts = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert len(texts) == 3 and final.usage.output_tokens == 3
