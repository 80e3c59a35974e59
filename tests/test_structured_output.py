"""Structured output across the protocols, over loopback with the real SDKs.

An Anthropic target has no ``response_format``: firstbyte sends the client's schema as a forced
tool and reads the tool's input back as the message's content, so ``.parse()`` works through an
Anthropic-kind fake (chat and Responses, buffered and streamed). Stop sequences come back as
the client's API says them: an Anthropic ``stop_sequence`` is a chat ``stop``, and a chat server
that says which sequence matched (vLLM, SGLang) is a Messages ``stop_sequence``.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from pydantic import BaseModel

from .anthropic_fakes import USAGE_IN, USAGE_OUT, anthropic_provider, event, message_body, messages_handler
from .conftest import openai_provider, route_config, sse


class Weather(BaseModel):
    city: str
    degrees: int


ANSWER = {"city": "Oslo", "degrees": 7}
PIECES = ['{"city": "Os', 'lo", "degr', 'ees": 7}']


def tool_answer_handler(seen: list[dict[str, Any]]) -> Any:
    """An Anthropic Messages fake that answers with the forced tool it was given, as Claude does:
    a tool_use block whose input is the answer (buffered), or that input in input_json_delta pieces."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        name = body["tool_choice"]["name"]
        if not body.get("stream"):
            answer = message_body(model=body["model"], stop="tool_use")
            answer["content"] = [{"type": "tool_use", "id": "toolu_1", "name": name, "input": ANSWER}]
            return web.json_response(answer)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        start = {**message_body(model=body["model"]), "content": [], "stop_reason": None,
                 "usage": {"input_tokens": USAGE_IN, "output_tokens": 1}}
        events = [event("message_start", {"message": start}),
                  event("content_block_start", {"index": 0, "content_block": {
                      "type": "tool_use", "id": "toolu_1", "name": name, "input": {}}}),
                  event("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}})]
        events += [event("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": p}})
                   for p in PIECES]
        events += [event("content_block_stop", {"index": 0}),
                   event("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                           "usage": {"output_tokens": USAGE_OUT}}),
                   event("message_stop", {})]
        for piece in events:
            await response.write(piece)
        await response.write_eof()
        return response

    return handle


@pytest.fixture
async def clients():
    made: list[Any] = []

    def make(url: str, kind: str = "openai") -> Any:
        if kind == "openai":
            made.append(openai.AsyncOpenAI(base_url=url + "/v1", api_key="client-key", max_retries=0))
        else:
            made.append(anthropic.AsyncAnthropic(base_url=url, api_key="client-key", max_retries=0))
        return made[-1]

    yield make
    for c in made:
        await c.close()


async def to_claude(upstreams, proxy, seen):
    up = await upstreams({"/v1/messages": tool_answer_handler(seen)})
    return await proxy(route_config([{"provider": "claude", "model": "claude-x"}],
                                    {"claude": anthropic_provider(up.url)}))


def assert_forced_tool(sent: dict[str, Any], schema: dict[str, Any]) -> None:
    assert sent["tool_choice"] == {"type": "tool", "name": "json_answer"}
    assert [t["name"] for t in sent["tools"]] == ["json_answer"]
    assert sent["tools"][0]["input_schema"] == schema


async def test_chat_parse_through_an_anthropic_target_buffered(upstreams, proxy, clients):
    seen: list[dict[str, Any]] = []
    p = await to_claude(upstreams, proxy, seen)
    completion = await clients(p.url).chat.completions.parse(
        model="chat", messages=[{"role": "user", "content": "Weather in Oslo?"}], response_format=Weather)
    choice = completion.choices[0]
    assert choice.message.parsed == Weather(**ANSWER)
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert_forced_tool(seen[0], openai.lib._pydantic.to_strict_json_schema(Weather))


async def test_chat_parse_through_an_anthropic_target_streamed(upstreams, proxy, clients):
    seen: list[dict[str, Any]] = []
    p = await to_claude(upstreams, proxy, seen)
    async with clients(p.url).chat.completions.stream(
            model="chat", messages=[{"role": "user", "content": "Weather in Oslo?"}], response_format=Weather,
            stream_options={"include_usage": True}) as stream:
        deltas = [e.delta async for e in stream if e.type == "content.delta"]
        final = await stream.get_final_completion()
    assert [d for d in deltas if d] == PIECES  # the answer streams as content, piece by piece (after the role)
    assert final.choices[0].message.parsed == Weather(**ANSWER)
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.usage.completion_tokens == USAGE_OUT
    assert seen[0]["stream"] is True
    assert_forced_tool(seen[0], openai.lib._pydantic.to_strict_json_schema(Weather))


async def test_json_object_through_an_anthropic_target(upstreams, proxy, clients):
    seen: list[dict[str, Any]] = []
    p = await to_claude(upstreams, proxy, seen)
    completion = await clients(p.url).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "JSON please"}], response_format={"type": "json_object"})
    assert orjson.loads(completion.choices[0].message.content) == ANSWER
    assert_forced_tool(seen[0], {"type": "object"})


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_responses_parse_through_an_anthropic_target(upstreams, proxy, clients, stream):
    seen: list[dict[str, Any]] = []
    p = await to_claude(upstreams, proxy, seen)
    client = clients(p.url)
    if stream:
        async with client.responses.stream(model="chat", input="Weather in Oslo?", text_format=Weather) as events:
            response = await events.get_final_response()
    else:
        response = await client.responses.parse(model="chat", input="Weather in Oslo?", text_format=Weather)
    assert response.output_parsed == Weather(**ANSWER)
    assert response.status == "completed"
    assert_forced_tool(seen[0], openai.lib._pydantic.to_strict_json_schema(Weather))


async def test_response_format_with_tools_to_anthropic_is_refused_naming_the_field(upstreams, proxy, clients):
    seen: list[dict[str, Any]] = []
    p = await to_claude(upstreams, proxy, seen)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as info:
        await clients(p.url).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], tools=[tool],
            response_format={"type": "json_object"})
    error = info.value.body
    assert error["param"] == "response_format" and error["code"] == "untranslatable"
    assert "send one of the two" in error["message"]
    assert seen == []


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_an_anthropic_stop_sequence_is_a_chat_stop(upstreams, proxy, clients, stream):
    stopped = event("message_delta", {"delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
                                      "usage": {"output_tokens": 2}})
    start = {**message_body(), "content": [], "stop_reason": None}
    events = [event("message_start", {"message": start}),
              event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
              event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "one two"}}),
              event("content_block_stop", {"index": 0}), stopped, event("message_stop", {})]

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stop_sequences"] == ["END"]
        if not body.get("stream"):
            return web.json_response({**message_body("one two", stop="stop_sequence"), "stop_sequence": "END"})
        return await messages_handler(events=events)(request)

    up = await upstreams({"/v1/messages": handle})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}], {"claude": anthropic_provider(up.url)}))
    ask = {"model": "chat", "messages": [{"role": "user", "content": "count"}], "stop": ["END"]}
    client = clients(p.url)
    if stream:
        chunks = [c async for c in await client.chat.completions.create(**ask, stream=True)]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        completion = await client.chat.completions.create(**ask)
        finishes, text = [completion.choices[0].finish_reason], completion.choices[0].message.content
    assert finishes == ["stop"] and text == "one two"


def vllm_handler(matched_key: str) -> Any:
    """An OpenAI-compatible fake that says which stop sequence ended the answer, as vLLM
    (``stop_reason``) and SGLang (``matched_stop``) do."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["stop"] == ["END", "STOP"]
        if not body.get("stream"):
            return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "one two"}, "finish_reason": "stop",
                 matched_key: "STOP"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for chunk in ({"index": 0, "delta": {"content": "one two"}, "finish_reason": None},
                      {"index": 0, "delta": {}, "finish_reason": "stop", matched_key: "STOP"}):
            await response.write(sse({"id": "c", "object": "chat.completion.chunk", "choices": [chunk]}))
        await response.write(sse({"id": "c", "object": "chat.completion.chunk", "choices": [],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


@pytest.mark.parametrize("matched_key", ["stop_reason", "matched_stop"])
@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_a_matched_stop_sequence_is_a_messages_stop_sequence(upstreams, proxy, clients, stream, matched_key):
    up = await upstreams({"/v1/chat/completions": vllm_handler(matched_key)})
    p = await proxy(route_config([{"provider": "vllm", "model": "m"}], {"vllm": openai_provider(up.url)}))
    ask = {"model": "chat", "max_tokens": 50, "messages": [{"role": "user", "content": "count"}],
           "stop_sequences": ["END", "STOP"]}
    client = clients(p.url, "anthropic")
    if stream:
        async with client.messages.stream(**ask) as events:
            message = await events.get_final_message()
    else:
        message = await client.messages.create(**ask)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "STOP")
    assert message.content[0].text == "one two"


async def test_messages_structured_output_reaches_a_chat_target_as_response_format(upstreams, proxy, clients):
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": orjson.dumps(ANSWER).decode()},
             "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})

    up = await upstreams({"/v1/chat/completions": handle})
    p = await proxy(route_config([{"provider": "gpt", "model": "m"}], {"gpt": openai_provider(up.url)}))
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    message = await clients(p.url, "anthropic").messages.create(
        model="chat", max_tokens=50, messages=[{"role": "user", "content": "Oslo?"}],
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert orjson.loads(message.content[0].text) == ANSWER
    assert seen[0]["response_format"] == {"type": "json_schema",
                                          "json_schema": {"name": "output", "schema": schema, "strict": True}}
