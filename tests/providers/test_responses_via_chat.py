"""``POST /v1/responses`` over loopback with the openai SDK: translated to OpenAI chat, Anthropic
and simulated targets, as it is to a provider with ``responses: true``, failover, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from openai.types.responses import ResponseFunctionToolCall

from proxy.bounds import MAX_ANSWER_CONTAINERS, MAX_EVENT_CONTAINERS
from proxy.providers.responses_via_chat import ResponsesUsageTap
from proxy.translate.chat_to_responses import ResponsesStreamError

from ..anthropic_fakes import anthropic_provider, messages_handler
from ..conftest import (
    Recorder,
    chunk_event,
    decision_of,
    ok_handler,
    openai_provider,
    route_config,
    sse,
    status_handler,
)

TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}, "strict": True}


@pytest.fixture
async def sdk():
    clients: list[openai.AsyncOpenAI] = []

    def make(url: str) -> openai.AsyncOpenAI:
        clients.append(openai.AsyncOpenAI(base_url=url + "/v1", api_key="client-key", max_retries=0))
        return clients[-1]

    yield make
    for c in clients:
        await c.close()


def tool_round_trip_handler() -> Any:
    """A chat upstream that calls get_weather first, and answers once it has the result."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        answered = body["messages"][-1]["role"] == "tool"
        if not body.get("stream"):
            message: dict[str, Any] = (
                {"role": "assistant", "content": f"It is {body['messages'][-1]['content']}."} if answered else
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]})
            return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "up",
                                      "choices": [{"index": 0, "message": message,
                                                   "finish_reason": "stop" if answered else "tool_calls"}],
                                      "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}})
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if answered:
            pieces = [chunk_event("It is "), chunk_event(body["messages"][-1]["content"]), chunk_event("", "stop")]
        else:
            call = {"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": ""}}
            pieces = [sse({"id": "c", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}, "finish_reason": None}]})]
            for part in ('{"city":', '"Oslo"}'):
                pieces.append(sse({"id": "c", "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": part}}]},
                     "finish_reason": None}]}))
            pieces.append(chunk_event("", "tool_calls"))
        pieces.append(sse({"id": "c", "object": "chat.completion.chunk", "choices": [],
                           "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}))
        for piece in [*pieces, b"data: [DONE]\n\n"]:
            await response.write(piece)
        await response.write_eof()
        return response

    return handle


async def to_chat(upstreams, proxy, handler=None, **kwargs):
    up = await upstreams({"/v1/chat/completions": handler or ok_handler("from-gpt", chunks=3)})
    p = await proxy(route_config([{"provider": "gpt", "model": "gpt-x", "price": {"input": 1, "output": 2}}],
                                 {"gpt": openai_provider(up.url)}), **kwargs)
    return up, p


async def test_buffered_goes_through_chat_and_back(upstreams, proxy, sdk):
    recorder = Recorder()
    up, p = await to_chat(upstreams, proxy, observers=[recorder])
    raw = await sdk(p.url).responses.with_raw_response.create(
        model="chat", input="hi", instructions="Be brief.", max_output_tokens=40, temperature=0.1)
    response = raw.parse()
    assert response.output_text == "from-gpt" and response.status == "completed"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 1)
    sent = up.calls[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["json"] == {"model": "gpt-x", "max_tokens": 40, "temperature": 0.1,
                            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    assert "client-key" not in str(sent["headers"])
    decision = decision_of(dict(raw.headers))
    assert decision.served == "gpt" and decision.route == "chat"
    await p.stop()
    finished = recorder.seen[-1]
    assert finished.operation == "responses" and finished.path == "/v1/responses"
    assert finished.decision is not None and finished.decision.usage == {
        "prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert finished.decision.cost_usd == pytest.approx((3 * 1 + 1 * 2) / 1e6)


async def test_streamed_events_are_the_sdks_own_types_in_order(upstreams, proxy, sdk):
    recorder = Recorder()
    up, p = await to_chat(upstreams, proxy, observers=[recorder])
    async with sdk(p.url).responses.stream(model="chat", input="hi") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == "from-gpt0from-gpt1from-gpt2"
    assert up.calls[0]["json"]["stream"] is True
    assert up.calls[0]["json"]["stream_options"] == {"include_usage": True}
    await p.stop()
    assert recorder.seen[-1].stream and recorder.seen[-1].decision.served == "gpt"


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_function_tool_round_trip(upstreams, proxy, sdk, stream):
    up, p = await to_chat(upstreams, proxy, tool_round_trip_handler())
    client = sdk(p.url)
    conversation: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]

    async def ask() -> Any:
        if not stream:
            return await client.responses.create(model="chat", input=conversation, tools=[TOOL])
        async with client.responses.stream(model="chat", input=conversation, tools=[TOOL]) as s:
            async for _ in s:
                pass
            return await s.get_final_response()

    first = await ask()
    call = first.output[0]
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.name, call.arguments, call.call_id) == ("get_weather", '{"city":"Oslo"}', "call_1")
    assert up.calls[0]["json"]["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city", "parameters": TOOL["parameters"],
        "strict": True}}]
    conversation += [call.model_dump(exclude_none=True),
                     {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = await ask()
    assert second.output_text == "It is sunny." if not stream else second.output_text == "It is sunny"
    assert up.calls[1]["json"]["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_anthropic_target(upstreams, proxy, sdk, stream):
    up = await upstreams({"/v1/messages": messages_handler("Hello!", words=["Hel", "lo!"])})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}],
                                 {"claude": anthropic_provider(up.url)}))
    client = sdk(p.url)
    if stream:
        async with client.responses.stream(model="chat", input="hi", instructions="Be brief.") as s:
            types = [e.type async for e in s]
            response = await s.get_final_response()
        assert types[0] == "response.created" and types[-1] == "response.completed"
    else:
        response = await client.responses.create(model="chat", input="hi", instructions="Be brief.")
    assert response.output_text == "Hello!"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (25, 15)
    assert up.calls[0]["json"]["system"] == "Be brief."
    assert up.calls[0]["json"]["messages"] == [{"role": "user", "content": "hi"}]


def responses_upstream(seen: list[dict[str, Any]]) -> Any:
    """An upstream that serves the Responses API itself."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        answer = {"id": "resp_up", "object": "response", "created_at": 1, "status": "completed", "model": body["model"],
                  "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": "native", "annotations": []}]}],
                  "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
                  "incomplete_details": None, "instructions": None, "metadata": {}, "temperature": 1, "top_p": 1,
                  "usage": {"input_tokens": 6, "input_tokens_details": {"cached_tokens": 0},
                            "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": 8}}
        if not body.get("stream"):
            return web.json_response(answer)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        created = {**answer, "status": "in_progress", "output": [], "usage": None}
        events = [{"type": "response.created", "response": created},
                  {"type": "response.output_item.added", "output_index": 0,
                   "item": {**answer["output"][0], "status": "in_progress", "content": []}},
                  {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}},
                  {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                   "delta": "native", "logprobs": []},
                  {"type": "response.output_item.done", "output_index": 0, "item": answer["output"][0]},
                  {"type": "response.completed", "response": answer}]
        for seq, event in enumerate(events):
            await response.write(b"event: " + event["type"].encode() + b"\ndata: "
                                 + orjson.dumps({**event, "sequence_number": seq}) + b"\n\n")
        await response.write_eof()
        return response

    return handle


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_a_provider_with_responses_gets_the_request_as_it_is(upstreams, proxy, sdk, stream):
    seen: list[dict[str, Any]] = []
    up = await upstreams({"/v1/responses": responses_upstream(seen)})
    recorder = Recorder()
    p = await proxy(route_config([{"provider": "oai", "model": "gpt-5"}],
                                 {"oai": openai_provider(up.url, responses=True)}), observers=[recorder])
    ask: dict[str, Any] = {"model": "chat", "input": "hi", "tools": [{"type": "web_search"}],
                           "previous_response_id": "resp_0", "store": True}
    if stream:
        async with sdk(p.url).responses.stream(**ask) as s:
            async for _ in s:
                pass
            response = await s.get_final_response()
    else:
        response = await sdk(p.url).responses.create(**ask)
    assert response.output_text == "native"
    assert seen[0] == {**ask, "model": "gpt-5", **({"stream": True} if stream else {})}
    await p.stop()
    assert recorder.seen[-1].decision.usage == {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}


async def test_untranslatable_moves_on_to_a_target_that_can_take_it(upstreams, proxy, sdk):
    gpt = await upstreams({"/v1/chat/completions": ok_handler("chat")})
    seen: list[dict[str, Any]] = []
    native = await upstreams({"/v1/responses": responses_upstream(seen)})
    p = await proxy(route_config(
        [{"provider": "gpt", "model": "gpt-x"}, {"provider": "oai", "model": "gpt-5"}],
        {"gpt": openai_provider(gpt.url), "oai": openai_provider(native.url, responses=True)}))
    raw = await sdk(p.url).responses.with_raw_response.create(model="chat", input="hi",
                                                              previous_response_id="resp_0")
    assert raw.parse().output_text == "native"
    assert decision_of(dict(raw.headers)).attempt_outcomes() == [("gpt", "untranslatable"), ("oai", "200")]
    assert gpt.calls == []


@pytest.mark.parametrize(
    ("ask", "named"),
    [
        pytest.param({"previous_response_id": "resp_0"}, "previous_response_id", id="previous-response-id"),
        pytest.param({"background": True}, "background", id="background"),
        pytest.param({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "code_interpreter",
                     id="built-in-tool"),
    ],
)
async def test_untranslatable_everywhere_is_a_400_naming_it(upstreams, proxy, sdk, ask, named):
    _, p = await to_chat(upstreams, proxy)
    with pytest.raises(openai.BadRequestError) as info:
        await sdk(p.url).responses.create(model="chat", input="hi", **ask)
    assert info.value.code == "untranslatable"
    assert named in info.value.message and "responses: true" in info.value.message


async def test_failover_before_commit(upstreams, proxy, sdk):
    bad = await upstreams({"/v1/chat/completions": status_handler(503, "down")})
    good = await upstreams({"/v1/chat/completions": ok_handler("rescued")})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                 {"bad": openai_provider(bad.url), "good": openai_provider(good.url)}))
    raw = await sdk(p.url).responses.with_raw_response.create(model="chat", input="hi")
    assert raw.parse().output_text == "rescued"
    assert decision_of(dict(raw.headers)).attempt_outcomes() == [("bad", "503"), ("good", "200")]


async def test_a_stream_cut_after_commit_ends_with_error_and_failed(upstreams, proxy, sdk):
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("partial"))
        await response.write(sse({"error": {"message": "upstream fell over", "type": "server_error"}}))
        await response.write_eof()
        return response

    _, p = await to_chat(upstreams, proxy, cut)
    stream = await sdk(p.url).responses.create(model="chat", input="hi", stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert events[-1].response.status == "failed"
    assert "failed after it started" in events[-1].response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_errors_are_in_the_openai_shape(upstreams, proxy, sdk):
    _, p = await to_chat(upstreams, proxy)
    with pytest.raises(openai.NotFoundError) as info:
        await sdk(p.url).responses.create(model="nope", input="hi")
    assert info.value.code == "model_not_found"
    status, _, body = await p.post("/v1/responses", b"{not json")
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_json"


async def test_an_upstream_400_comes_back_as_it_is(upstreams, proxy, sdk):
    _, p = await to_chat(upstreams, proxy, status_handler(400, "temperature is out of range"))
    with pytest.raises(openai.BadRequestError) as info:
        await sdk(p.url).responses.create(model="chat", input="hi", temperature=5)
    assert "temperature is out of range" in info.value.message


async def test_a_passthrough_stream_cut_ends_with_an_error_event_numbered_on(raw_upstreams, proxy, sdk):
    async def cut(reader: Any, writer: Any) -> None:
        created = {"type": "response.created", "sequence_number": 0, "response": {
            "id": "resp_up", "object": "response", "created_at": 1, "status": "in_progress", "model": "gpt-5",
            "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
            "incomplete_details": None, "instructions": None, "metadata": {}, "temperature": 1, "top_p": 1}}
        delta = {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_up",
                 "output_index": 0, "content_index": 0, "delta": "Hel", "logprobs": []}
        body = b"event: response.created\ndata: " + orjson.dumps(created) + b"\n\n"
        # a first token, so the stream commits (docs/adr/0007); a cut before it would fail over instead
        body += b"event: response.output_text.delta\ndata: " + orjson.dumps(delta) + b"\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 100000\r\n\r\n" + body)
        await writer.drain()

    up = await raw_upstreams(cut)
    p = await proxy(route_config([{"provider": "oai", "model": "gpt-5"}],
                                 {"oai": openai_provider(up.url, responses=True)}))
    stream = await sdk(p.url).responses.create(model="chat", input="hi", stream=True)
    events = [event async for event in stream]
    assert [(e.type, e.sequence_number) for e in events] == [
        ("response.created", 0), ("response.output_text.delta", 1), ("error", 2)]
    assert "failed after it started" in events[-1].message


@pytest.mark.parametrize("levels", [pytest.param(700, id="past-the-chunk-depth"),
                                    pytest.param(5000, id="past-what-orjson-reads")])
async def test_a_passthrough_event_nested_past_a_clients_parser_ends_the_stream(upstreams, proxy, sdk, levels):
    """A provider's own Responses stream is relayed as it is: after its first token, an event nested
    past what a client's parser reads reached the openai SDK, which raised RecursionError in the
    application (the chat and Anthropic taps end the stream on it since this session; this tap did not)."""
    seq = iter(range(10))

    def event(payload: dict[str, Any], tail: bytes = b"") -> bytes:
        data = orjson.dumps({**payload, "sequence_number": next(seq)})
        return b"event: " + payload["type"].encode() + b"\ndata: " + data[:-1] + tail + b"}\n\n"

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        delta = {"type": "response.output_text.delta", "item_id": "msg_up", "output_index": 0, "content_index": 0,
                 "delta": "Hel", "logprobs": []}
        await response.write(event(delta))
        await asyncio.sleep(0.05)  # a read of its own: after the commit
        await response.write(event({**delta, "delta": "lo"}, b',"x":' + b"[" * levels + b"]" * levels))
        await response.write_eof()
        return response

    up = await upstreams({"/v1/responses": stream})
    p = await proxy(route_config([{"provider": "oai", "model": "gpt-5"}],
                                 {"oai": openai_provider(up.url, responses=True)}))
    events = [e async for e in await sdk(p.url).responses.create(model="chat", input="hi", stream=True)]
    assert [(e.type, e.sequence_number) for e in events] == [("response.output_text.delta", 0), ("error", 1)]
    assert "failed after it started" in events[-1].message


@pytest.mark.parametrize(("wide", "ends"), [
    pytest.param(MAX_EVENT_CONTAINERS * 2, False, id="a-whole-answers-closing-event-past-the-event-cap-passes"),
    pytest.param(MAX_ANSWER_CONTAINERS, True, id="past-the-answer-cap-ends-the-stream"),
])
def test_a_responses_stream_bounds_its_events_by_the_answer_cap(wide: int, ends: bool) -> None:
    """``response.completed`` carries the whole answer, its logprobs too (hundreds of thousands of containers):
    a Responses stream relayed as it is has the buffered answer's cap per event, not a chat chunk's."""
    delta = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'
    closing = (b'event: response.completed\ndata: {"type":"response.completed","response":{"output":[],'
               b'"x":[' + b",".join([b"[]"] * wide) + b"]}}\n\n")
    tap = ResponsesUsageTap()
    if not ends:
        assert tap.feed(delta + closing) == delta + closing and tap.done
        return
    with pytest.raises(ResponsesStreamError) as raised:
        tap.feed(delta + closing)
    assert raised.value.partial == delta and f"{MAX_ANSWER_CONTAINERS + 4:,} JSON objects" in raised.value.message
