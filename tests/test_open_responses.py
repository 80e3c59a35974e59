"""The Open Responses spec, checked over loopback on what firstbyte serves at ``/v1/responses``.

The Open Responses compliance suite (``openresponses/openresponses``, ``bin/compliance-test.ts``)
sends a few requests (a text answer, a stream, a system prompt, a function tool buffered and
streamed, an image, a multi-turn conversation) and validates every answer, and every event of
a stream, against the spec's schemas. These tests send the same kinds of request, through the
shipped routes.yaml (simulated targets) and through OpenAI- and Anthropic-kind fakes, with the
real openai SDK and as raw JSON, and check the fields the spec requires with its types. The
suite itself runs with ``scripts/open-responses-compliance``. The tables below are written from
the spec's OpenAPI document (``ResponseResource``, ``ItemField``, ``FunctionTool``, ``Usage`` and
the streaming events).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
import yaml

from .anthropic_fakes import anthropic_provider, messages_handler
from .conftest import ok_handler, openai_provider, route_config

ROOT = Path(__file__).resolve().parent.parent

NUMBER = "number"
INT = "integer"
STR = "string"
BOOL = "boolean"
OBJ = "object"
LIST = "array"
NULL = "null"
ANY = "any"

_TYPES: dict[str, Any] = {STR: str, BOOL: bool, OBJ: dict, LIST: list}

# ResponseResource: every field required; a tuple is the types allowed.
RESPONSE = {
    "id": STR, "object": STR, "created_at": INT, "completed_at": (INT, NULL), "status": STR,
    "incomplete_details": (OBJ, NULL), "model": STR, "previous_response_id": (STR, NULL),
    "instructions": (STR, NULL), "output": LIST, "error": (OBJ, NULL), "tools": LIST, "tool_choice": (STR, OBJ),
    "truncation": STR, "parallel_tool_calls": BOOL, "text": OBJ, "top_p": NUMBER, "presence_penalty": NUMBER,
    "frequency_penalty": NUMBER, "top_logprobs": INT, "temperature": NUMBER, "reasoning": (OBJ, NULL),
    "usage": (OBJ, NULL), "max_output_tokens": (INT, NULL), "max_tool_calls": (INT, NULL), "store": BOOL,
    "background": BOOL, "service_tier": STR, "metadata": ANY, "safety_identifier": (STR, NULL),
    "prompt_cache_key": (STR, NULL),
}
MESSAGE = {"type": STR, "id": STR, "status": STR, "role": STR, "content": LIST}
FUNCTION_CALL = {"type": STR, "id": STR, "call_id": STR, "name": STR, "arguments": STR, "status": STR}
OUTPUT_TEXT = {"type": STR, "text": STR, "annotations": LIST}
FUNCTION_TOOL = {"type": STR, "name": STR, "description": (STR, NULL), "parameters": (OBJ, NULL),
                 "strict": (BOOL, NULL)}
USAGE = {"input_tokens": INT, "output_tokens": INT, "total_tokens": INT, "input_tokens_details": OBJ,
         "output_tokens_details": OBJ}
STATUSES = ("in_progress", "completed", "incomplete")
JSON_SCHEMA_FORMAT = {"type": STR, "name": STR, "description": (STR, NULL), "schema": ANY, "strict": BOOL}
REASONING = {"effort": (STR, NULL), "summary": (STR, NULL)}

_EVENT = {"type": STR, "sequence_number": INT}
_PART = {**_EVENT, "item_id": STR, "output_index": INT, "content_index": INT}
EVENTS: dict[str, dict[str, Any]] = {
    **{kind: {**_EVENT, "response": OBJ} for kind in (
        "response.created", "response.in_progress", "response.completed", "response.failed", "response.incomplete")},
    "response.output_item.added": {**_EVENT, "output_index": INT, "item": OBJ},
    "response.output_item.done": {**_EVENT, "output_index": INT, "item": OBJ},
    "response.content_part.added": {**_PART, "part": OBJ},
    "response.content_part.done": {**_PART, "part": OBJ},
    "response.output_text.delta": {**_PART, "delta": STR},
    "response.output_text.done": {**_PART, "text": STR},
    "response.function_call_arguments.delta": {**_EVENT, "item_id": STR, "output_index": INT, "delta": STR},
    "response.function_call_arguments.done": {**_EVENT, "item_id": STR, "output_index": INT, "arguments": STR},
}


def _is(value: Any, kind: str) -> bool:
    if kind == ANY:
        return True
    if kind == NULL:
        return value is None
    if kind in (INT, NUMBER):
        if isinstance(value, bool):
            return False
        return isinstance(value, int) if kind == INT else isinstance(value, int | float)
    return isinstance(value, _TYPES[kind])


def shape(obj: Any, spec: dict[str, Any], where: str) -> list[str]:
    """What in ``obj`` the spec's table refuses: a missing field, or one of another type."""
    if not isinstance(obj, dict):
        return [f"{where}: expected an object, got {obj!r}"]
    problems = []
    for key, kinds in spec.items():
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if key not in obj:
            problems.append(f"{where}.{key}: required, missing")
        elif not any(_is(obj[key], k) for k in kinds):
            problems.append(f"{where}.{key}: expected {' or '.join(kinds)}, got {obj[key]!r}")
    return problems


def item_problems(item: Any, where: str) -> list[str]:
    kind = item.get("type") if isinstance(item, dict) else None
    if kind == "message":
        problems = shape(item, MESSAGE, where)
        for j, part in enumerate(item.get("content") or []):
            problems += shape(part, OUTPUT_TEXT, f"{where}.content[{j}]") if part.get("type") == "output_text" else []
    elif kind == "function_call":
        problems = shape(item, FUNCTION_CALL, where)
    else:
        return [f"{where}.type: {kind!r} is no output item firstbyte should send"]
    if item.get("status") not in STATUSES:
        problems.append(f"{where}.status: {item.get('status')!r} not one of {STATUSES}")
    return problems


def response_problems(response: Any, where: str = "response") -> list[str]:
    problems = shape(response, RESPONSE, where)
    if not isinstance(response, dict):
        return problems
    for i, item in enumerate(response.get("output") or []):
        problems += item_problems(item, f"{where}.output[{i}]")
    for i, tool in enumerate(response.get("tools") or []):
        problems += shape(tool, FUNCTION_TOOL, f"{where}.tools[{i}]")
    if response.get("usage") is not None:
        problems += shape(response["usage"], USAGE, f"{where}.usage")
    if response.get("truncation") not in ("auto", "disabled"):
        problems.append(f"{where}.truncation: {response.get('truncation')!r}")
    fmt = (response.get("text") or {}).get("format")
    if not isinstance(fmt, dict):
        problems.append(f"{where}.text.format: required, missing")
    elif fmt.get("type") == "json_schema":
        problems += shape(fmt, JSON_SCHEMA_FORMAT, f"{where}.text.format")
    if response.get("reasoning") is not None:
        problems += shape(response["reasoning"], REASONING, f"{where}.reasoning")
    return problems


def event_problems(event: dict[str, Any], i: int) -> list[str]:
    kind = event.get("type")
    where = f"event[{i}] {kind}"
    if kind not in EVENTS:
        return [f"{where}: an event type the spec does not have"]
    problems = shape(event, EVENTS[kind], where)
    if "response" in EVENTS[kind]:
        problems += response_problems(event.get("response"), f"{where}.response")
    if "item" in EVENTS[kind]:
        problems += item_problems(event.get("item"), f"{where}.item")
    if "part" in EVENTS[kind]:
        problems += shape(event.get("part"), OUTPUT_TEXT, f"{where}.part")
    return problems


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The data of each event of a Responses stream, as the suite's parser reads it."""
    out = []
    for block in raw.decode().split("\n\n"):
        data = [line[5:].strip() for line in block.splitlines() if line.startswith("data:")]
        if data and data[0] != "[DONE]":
            out.append(orjson.loads("\n".join(data)))
    return out


WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather for a location",
           "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}
IMAGE = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSAAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
         "RU5ErkJggg==")

# The kinds of request the compliance suite sends (its templates' inputs, paraphrased).
ASKS = [
    pytest.param({"input": [{"type": "message", "role": "user", "content": "Say hello in exactly 3 words."}]},
                 False, "message", id="basic-response"),
    pytest.param({"input": [{"type": "message", "role": "user", "content": "Count from 1 to 5."}]},
                 True, "message", id="streaming-response"),
    pytest.param({"input": [{"type": "message", "role": "system", "content": "You are a pirate."},
                            {"type": "message", "role": "user", "content": "Say hello."}]},
                 False, "message", id="system-prompt"),
    pytest.param({"input": [{"type": "message", "role": "user", "content": "Weather in San Francisco?"}],
                  "tools": [WEATHER]}, False, "function_call", id="tool-calling"),
    pytest.param({"input": [{"type": "message", "role": "user", "content": "Weather in San Francisco?"}],
                  "tools": [WEATHER]}, True, "function_call", id="tool-calling-streaming"),
    pytest.param({"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What do you see?"}, {"type": "input_image", "image_url": IMAGE}]}]},
                 False, "message", id="image-input"),
    pytest.param({"input": [{"type": "message", "role": "user", "content": "My name is Alice."},
                            {"type": "message", "role": "assistant", "content": "Hello Alice!"},
                            {"type": "message", "role": "user", "content": "What is my name?"}]},
                 False, "message", id="multi-turn"),
]


@pytest.fixture
async def shipped(proxy):
    """firstbyte serving the shipped routes.yaml (simulated targets behind route ``chat``)."""
    raw = yaml.safe_load((ROOT / "routes.yaml").read_text())
    return await proxy(raw)


async def post_responses(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/responses", json=body) as resp:
        return resp.status, await resp.read()


@pytest.mark.parametrize(("ask", "stream", "kind"), ASKS)
async def test_what_the_compliance_suite_sends_validates_against_the_spec(shipped, ask, stream, kind):
    status, raw = await post_responses(shipped.url, {"model": "chat", **ask, "stream": stream})
    assert status == 200, raw[:500]
    if stream:
        events = sse_events(raw)
        problems = [p for i, e in enumerate(events) for p in event_problems(e, i)]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        final = events[-1]["response"]
        if kind == "function_call":
            types = [e["type"] for e in events]
            assert "response.function_call_arguments.delta" in types
            assert "response.function_call_arguments.done" in types
            assert any(e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
                       for e in events)
            assert any(e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"
                       for e in events)
    else:
        final = orjson.loads(raw)
        problems = response_problems(final)
    assert problems == []
    assert final["status"] == "completed" and isinstance(final["completed_at"], int)
    assert any(item["type"] == kind for item in final["output"])


def test_the_field_table_refuses_what_the_spec_refuses() -> None:
    """The checker itself: a Response as firstbyte sent it before (no penalties, no service tier,
    null sampling knobs, a tool without strict) fails it, field by field."""
    old = {key: None for key in RESPONSE} | {
        "id": "r", "object": "response", "created_at": 1, "status": "completed", "model": "m", "output": [],
        "tools": [{"type": "function", "name": "f", "parameters": {}}], "tool_choice": "auto",
        "truncation": "disabled", "parallel_tool_calls": True, "text": {"format": {"type": "text"}},
        "store": False, "background": False, "metadata": {}}
    for key in ("presence_penalty", "frequency_penalty", "top_logprobs", "service_tier", "max_tool_calls",
                "safety_identifier", "prompt_cache_key", "completed_at"):
        del old[key]
    problems = response_problems(old)
    for key in ("presence_penalty", "frequency_penalty", "top_logprobs", "service_tier", "max_tool_calls",
                "safety_identifier", "prompt_cache_key", "completed_at", "tools[0].strict", "tools[0].description"):
        assert any(p.startswith(f"response.{key}:") for p in problems), key
    assert "response.temperature: expected number, got None" in problems
    assert "response.top_p: expected number, got None" in problems


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_the_openai_sdk_reads_the_spec_fields_through_each_kind(upstreams, proxy, stream, kind):
    """The openai SDK's responses.create and responses.stream through a chat-kind and an
    Anthropic-kind fake: the echoed request (sampling knobs, tools with strict, identifiers) and
    the snapshots in response.created and response.in_progress (completed_at null)."""
    if kind == "openai":
        up = await upstreams({"/v1/chat/completions": ok_handler("hi there", chunks=2)})
        provider = openai_provider(up.url)
    else:
        up = await upstreams({"/v1/messages": messages_handler("hi there", words=["hi ", "there"])})
        provider = anthropic_provider(up.url)
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": provider}))
    ask: dict[str, Any] = dict(model="chat", input="hi", tools=[WEATHER], temperature=0.5, top_logprobs=0,
                               safety_identifier="user-1", prompt_cache_key="k-1")
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        if stream:
            async with client.responses.stream(**ask) as events:
                seen = [e async for e in events]
                final = await events.get_final_response()
            snapshots = [e.response for e in seen if e.type in ("response.created", "response.in_progress")]
            assert len(snapshots) == 2 and all(s.completed_at is None for s in snapshots)
            assert all(s.status == "in_progress" for s in snapshots)
        else:
            raw = await client.responses.with_raw_response.create(**ask)
            assert response_problems(orjson.loads(raw.content)) == []
            final = raw.parse()
    finally:
        await client.close()
    assert final.output_text.startswith("hi there") and final.status == "completed"
    assert (final.temperature, final.top_p) == (0.5, 1.0)
    dumped = final.model_dump()
    assert (dumped["presence_penalty"], dumped["frequency_penalty"], dumped["top_logprobs"]) == (0.0, 0.0, 0)
    assert (final.service_tier, final.max_tool_calls) == ("default", None)
    assert (final.safety_identifier, final.prompt_cache_key) == ("user-1", "k-1")
    assert isinstance(final.completed_at, int | float)
    tool = final.tools[0]
    assert (tool.name, tool.strict, tool.description) == ("get_weather", None, WEATHER["description"])


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_a_json_schema_format_and_a_partial_reasoning_are_echoed_whole(shipped, stream):
    """The request's text.format (json_schema without description or strict) and reasoning (an
    effort without a summary) come back with every field the spec's objects require."""
    fmt = {"type": "json_schema", "name": "weather", "schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    body = {"model": "chat", "input": "Weather in Oslo?", "text": {"format": fmt}, "reasoning": {"effort": "low"},
            "stream": stream}
    status, raw = await post_responses(shipped.url, body)
    assert status == 200, raw[:500]
    final = sse_events(raw)[-1]["response"] if stream else orjson.loads(raw)
    assert response_problems(final) == []
    assert final["text"]["format"] == {"description": None, "strict": False, **fmt}
    assert final["reasoning"] == {"effort": "low", "summary": None}
