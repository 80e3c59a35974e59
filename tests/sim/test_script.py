"""The simulated model: what it says to tools, tool_choice, response_format, n, stop and
max_tokens (pure tables), and the same over all four endpoints with the real clients."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import orjson
import pytest

from proxy.sim.script import example_of, needs_script, script_for

from ..conftest import route_config

WORDS = [f"tok{i} " for i in range(6)]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 2}},
    "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def chat(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}


@pytest.mark.parametrize(
    ("body", "called"),
    [
        pytest.param(chat(tools=[WEATHER, TIME]), None, id="auto-and-not-asked-answers"),
        pytest.param(chat("what does get_time say?", tools=[WEATHER, TIME]), "get_time", id="auto-asked-by-name"),
        pytest.param(chat("use get weather", tools=[WEATHER, TIME]), "get_weather", id="auto-asked-in-words"),
        pytest.param(chat(tools=[WEATHER, TIME], tool_choice="required"), "get_weather", id="required-first"),
        pytest.param(chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}),
                     "get_time", id="forced-by-name"),
        pytest.param(chat("use get_time", tools=[WEATHER, TIME], tool_choice="none"), None, id="none-never-calls"),
        pytest.param({"messages": [{"role": "user", "content": "use get_time"},
                                   {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                                         "function": {"name": "get_time"}}]},
                                   {"role": "tool", "tool_call_id": "c", "content": "noon"}],
                      "tools": [TIME]}, None, id="after-a-tool-result-it-answers"),
    ],
)
def test_which_tool_it_calls(body: dict[str, Any], called: str | None) -> None:
    assert needs_script(body, len(WORDS))
    choice = script_for("chat", body, WORDS).choices[0]
    assert [c.name for c in choice.calls] == ([called] if called else [])
    assert choice.finish == ("tool_calls" if called else "stop")
    if called:
        arguments = json.loads("".join(choice.calls[0].arguments))
        assert arguments == ({"city": "sim", "days": 2} if called == "get_weather" else {})
    else:
        assert choice.pieces


def test_after_a_tool_result_it_says_what_the_tool_returned() -> None:
    body = {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c", "content": "noon"}]}
    assert "".join(script_for("chat", body, WORDS).choices[0].pieces).strip() == "The tool returned: noon"


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        pytest.param({"type": "string"}, "sim", id="string"),
        pytest.param({"type": "string", "enum": ["c", "f"]}, "c", id="enum"),
        pytest.param({"type": "string", "format": "date"}, "2026-01-01", id="date"),
        pytest.param({"type": "string", "minLength": 5}, "simxx", id="min-length"),
        pytest.param({"type": "integer", "minimum": 3, "maximum": 9}, 3, id="integer-bounds"),
        pytest.param({"type": "number", "exclusiveMinimum": 1.0}, 1.5, id="number-exclusive"),
        pytest.param({"type": "number"}, 1, id="whole-number-for-integer-typed-clients"),
        pytest.param({"type": ["null", "boolean"]}, True, id="type-list"),
        pytest.param({"type": "array", "items": {"type": "integer"}, "minItems": 2}, [1, 1], id="array"),
        pytest.param({"anyOf": [{"type": "null"}, {"type": "string"}]}, "sim", id="optional-any-of"),
        pytest.param({"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
                      "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
                     {"p": {"x": 1}}, id="ref-into-defs"),
        pytest.param({"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}},
                                {"properties": {"b": {"const": 2}}}]}, {"a": True, "b": 2}, id="all-of"),
    ],
)
def test_arguments_satisfy_the_schema(schema: dict[str, Any], value: Any) -> None:
    assert example_of(schema, schema) == value


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        pytest.param({"type": "string", "minLength": "3", "format": ["date"]}, "sim",
                     id="mistyped-keywords-are-absent"),
        pytest.param({"enum": 5, "allOf": 1, "anyOf": {"a": 1}, "type": "object", "properties": []}, {},
                     id="mistyped-combinators"),
        pytest.param({"type": "integer", "exclusiveMinimum": 1e30}, 2**53, id="a-bound-past-exact-integers"),
        pytest.param({"type": "string", "minLength": 10**9}, "sim" + "x" * 1021, id="a-huge-min-length"),
        pytest.param({"type": "array", "minItems": 10**9, "items": {"type": "boolean"}}, [True] * 16,
                     id="a-huge-min-items"),
    ],
)
def test_a_schema_the_client_got_wrong_still_gives_a_bounded_value(schema: dict[str, Any], value: Any) -> None:
    """The edge checks a tool's schema only to be an object (``server/shapes.py``): the simulator
    reads its keywords leniently, within bounds, and writes a value JSON can carry."""
    got = example_of(schema, schema)
    assert got == value and orjson.dumps(got)


def test_a_schema_that_refers_to_itself_stays_within_its_budget() -> None:
    node = {"type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/node"} for i in range(10)}}
    schema = {"$ref": "#/$defs/node", "$defs": {"node": node}}
    assert len(orjson.dumps(example_of(schema, schema))) < 200_000  # 10 ** 12 values without the budget


@pytest.mark.parametrize(
    ("body", "texts", "finish"),
    [
        pytest.param(chat(n=3), ["tok0 tok1 tok2 tok3 tok4 tok5 "] * 3, "stop", id="n"),
        pytest.param(chat(stop=["tok2"]), ["tok0 tok1 "], "stop", id="stop-cuts-before-the-sequence"),
        pytest.param(chat(stop="nothing-matches"), ["tok0 tok1 tok2 tok3 tok4 tok5 "], "stop", id="stop-no-match"),
        pytest.param(chat(max_tokens=2), ["tok0 tok1 "], "length", id="max-tokens"),
        pytest.param(chat(max_completion_tokens=3, n=2), ["tok0 tok1 tok2 "] * 2, "length",
                     id="max-completion-tokens-per-choice"),
        pytest.param(chat(response_format={"type": "json_object"}), ['{"answer":"simulated"}'], "stop",
                     id="json-object"),
    ],
)
def test_text_controls(body: dict[str, Any], texts: list[str], finish: str) -> None:
    script = script_for("chat", body, WORDS)
    assert ["".join(c.pieces) for c in script.choices] == texts
    assert {c.finish for c in script.choices} == {finish}


def test_json_schema_answer_is_schema_shaped() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
                                                                                   "items": {"type": "string"}}},
              "required": ["name", "tags"], "additionalProperties": False}
    body = chat(response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    assert json.loads("".join(script_for("chat", body, WORDS).choices[0].pieces)) == {"name": "sim", "tags": ["sim"]}


@pytest.mark.parametrize(
    ("body", "scripted"),
    [
        pytest.param(chat(), False, id="plain"),
        pytest.param(chat(max_tokens=16), False, id="a-budget-it-fits-in"),
        pytest.param(chat(max_tokens=3), True, id="a-budget-that-cuts"),
        pytest.param(chat(stream=True, temperature=0), False, id="sampling-knobs"),
        pytest.param(chat(n=2), True, id="n"),
    ],
)
def test_the_plain_path_stays_plain(body: dict[str, Any], scripted: bool) -> None:
    assert needs_script(body, len(WORDS)) is scripted


# --- the four endpoints, with the real clients ---------------------------------------------------

SIM = {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0, "chunk_ms": 0, "chunks": 6}}
TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
async def sim_proxy(proxy):
    return await proxy(route_config([{"provider": "sim", "model": "sim-1"}], {"sim": SIM}))


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_chat_endpoint(sim_proxy, stream):
    client = openai.AsyncOpenAI(base_url=sim_proxy.url + "/v1", api_key="x", max_retries=0)
    tools: Any = [{"type": "function", "function": {"name": "lookup", "parameters": TOOL_SCHEMA}}]
    ask: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": tools,
                           "tool_choice": "required", "n": 2}
    if not stream:
        answer = await client.chat.completions.create(**ask)
        calls = [c.message.tool_calls[0] for c in answer.choices]
        assert answer.usage is not None and answer.usage.completion_tokens > 0
    else:
        chunks = [c async for c in await client.chat.completions.create(
            **ask, stream=True, stream_options={"include_usage": True})]
        by_choice: dict[int, str] = {}
        for c in chunks:
            for choice in c.choices:
                for call in choice.delta.tool_calls or []:
                    by_choice[choice.index] = by_choice.get(choice.index, "") + (call.function.arguments or "")
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        calls = [type("Call", (), {"function": type("F", (), {"name": "lookup", "arguments": a})})()
                 for a in by_choice.values()]
    assert len(calls) == 2
    assert all(json.loads(c.function.arguments) == {"city": "sim"} and c.function.name == "lookup" for c in calls)
    await client.close()


async def test_completions_endpoint(sim_proxy):
    client = openai.AsyncOpenAI(base_url=sim_proxy.url + "/v1", api_key="x", max_retries=0)
    answer = await client.completions.create(model="chat", prompt="hi", n=2, stop=["tok3"], max_tokens=5)
    assert [c.text for c in answer.choices] == ["tok0 tok1 tok2 "] * 2
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    await client.close()


async def test_messages_endpoint_calls_a_tool_and_answers_after_it(sim_proxy):
    client = anthropic.AsyncAnthropic(base_url=sim_proxy.url, api_key="x", max_retries=0)
    tools: Any = [{"name": "lookup", "description": "Find a city", "input_schema": TOOL_SCHEMA}]
    first = await client.messages.create(model="chat", max_tokens=200, tools=tools,
                                         messages=[{"role": "user", "content": "please lookup Oslo"}])
    assert first.stop_reason == "tool_use"
    use = first.content[0]
    assert use.type == "tool_use" and use.name == "lookup" and use.input == {"city": "sim"}
    second = await client.messages.create(model="chat", max_tokens=200, tools=tools, messages=[
        {"role": "user", "content": "please lookup Oslo"},
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "cold"}]}])
    assert second.stop_reason == "end_turn"
    assert second.content[0].type == "text" and second.content[0].text.strip() == "The tool returned: cold"
    short = await client.messages.create(model="chat", max_tokens=2, messages=[{"role": "user", "content": "hi"}],
                                         stop_sequences=["tok5"])
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    await client.close()


async def test_responses_endpoint_json_schema(sim_proxy):
    client = openai.AsyncOpenAI(base_url=sim_proxy.url + "/v1", api_key="x", max_retries=0)
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "number"}},
              "required": ["city", "temp"], "additionalProperties": False}
    answer = await client.responses.create(model="chat", input="weather as JSON", text={
        "format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}})
    assert json.loads(answer.output_text) == {"city": "sim", "temp": 1}
    short = await client.responses.create(model="chat", input="hi", max_output_tokens=2)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.output_text == "tok0 tok1 " and short.usage.output_tokens == 2
    await client.close()
