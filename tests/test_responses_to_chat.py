"""The Responses API <-> chat completions translation, as pure tables, and the event stream
checked against the openai SDK's own event types."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.providers.chat_to_anthropic import TranslationError
from proxy.providers.chat_to_responses import ChatStreamToResponses, ResponsesStreamError, chat_to_response
from proxy.providers.responses_to_chat import responses_to_chat

from .conftest import chunk_event, sse

FN = {"type": "function", "name": "get_weather", "description": "Weather now",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_FN = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": FN["parameters"]}}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param({"input": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}, id="string-input"),
        pytest.param({"input": "hi", "instructions": "Be brief."},
                     {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]},
                     id="instructions-become-system"),
        pytest.param({"input": [{"role": "developer", "content": "Rules."},
                                {"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": "a"},
                                             {"type": "input_text", "text": "b"}]}]},
                     {"messages": [{"role": "system", "content": "Rules."}, {"role": "user", "content": "a\n\nb"}]},
                     id="developer-is-system-and-text-parts-join"),
        pytest.param({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}]}]},
                     {"messages": [{"role": "user", "content": [
                         {"type": "text", "text": "what is this"},
                         {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}]}]},
                     id="image-part"),
        pytest.param({"input": [
            {"role": "user", "content": "weather?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "cold"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "warm"}]},
        ]},
            {"messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
                    {"id": "c2", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "cold"},
                {"role": "tool", "tool_call_id": "c2", "content": "warm"},
            ]},
            id="function-call-round-trip-joins-the-assistant-turn"),
        pytest.param({"input": [{"type": "reasoning", "id": "rs_1", "encrypted_content": "xx", "summary": []},
                                {"role": "user", "content": "go"}]},
                     {"messages": [{"role": "user", "content": "go"}]}, id="reasoning-items-stay-behind"),
        pytest.param({"input": "hi", "tools": [FN], "tool_choice": "required", "parallel_tool_calls": False},
                     {"messages": [{"role": "user", "content": "hi"}], "tools": [CHAT_FN], "tool_choice": "required",
                      "parallel_tool_calls": False}, id="function-tools"),
        pytest.param({"input": "hi", "tools": [FN], "tool_choice": {"type": "function", "name": "get_weather"}},
                     {"messages": [{"role": "user", "content": "hi"}], "tools": [CHAT_FN],
                      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                     id="forced-function"),
        pytest.param({"input": "hi", "tools": [{"type": "namespace", "name": "crm", "description": "CRM",
                                                "tools": [{"type": "function", "name": "find", "parameters": {}}]}]},
                     {"messages": [{"role": "user", "content": "hi"}], "tools": [
                         {"type": "function", "function": {"name": "crm__find",
                                                           "parameters": {"type": "object", "properties": {}}}}]},
                     id="namespace-tools-flatten"),
        pytest.param({"input": "hi", "max_output_tokens": 50, "temperature": 0.2, "top_p": 0.9, "user": "u1"},
                     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "temperature": 0.2,
                      "top_p": 0.9, "user": "u1"}, id="sampling-and-budget"),
        pytest.param({"input": "hi", "text": {"format": {"type": "json_schema", "name": "w", "strict": True,
                                                         "schema": {"type": "object"}}}},
                     {"messages": [{"role": "user", "content": "hi"}], "response_format": {
                         "type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"},
                                                                "strict": True}}},
                     id="json-schema-format"),
        pytest.param({"input": "hi", "text": {"format": {"type": "json_object"}}},
                     {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
                     id="json-object-format"),
        pytest.param({"input": "hi", "reasoning": {"effort": "low", "summary": "auto"}},
                     {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"},
                     id="reasoning-effort"),
        pytest.param({"input": "hi", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
                      "prompt_cache_key": "k", "metadata": {"a": "b"}},
                     {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                      "stream_options": {"include_usage": True}},
                     id="stream-asks-for-usage-and-hints-are-dropped"),
    ],
)
def test_request_translates(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert responses_to_chat(body, "up") == {"model": "up", **expected}


def test_reasoning_effort_only_where_the_target_takes_it() -> None:
    chat = responses_to_chat({"input": "hi", "reasoning": {"effort": "high"}}, "claude", reasoning=False)
    assert "reasoning_effort" not in chat


@pytest.mark.parametrize(
    ("body", "named"),
    [
        pytest.param({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", id="previous-response"),
        pytest.param({"input": "hi", "background": True}, "background", id="background"),
        pytest.param({"input": "hi", "conversation": "conv_1"}, "conversation", id="conversation"),
        pytest.param({"input": "hi", "tools": [{"type": "web_search"}]}, "web_search", id="web-search-tool"),
        pytest.param({"input": "hi", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
                     "code_interpreter", id="code-interpreter-tool"),
        pytest.param({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference", id="item-reference"),
        pytest.param({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]},
                     "file_id", id="image-by-file-id"),
        pytest.param({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
                     "input_file", id="input-file"),
        pytest.param({"input": "hi", "tools": [FN], "tool_choice": {"type": "web_search_preview"}},
                     "tool_choice", id="hosted-tool-choice"),
    ],
)
def test_what_cannot_be_carried_is_untranslatable(body: dict[str, Any], named: str) -> None:
    with pytest.raises(TranslationError, match=named):
        responses_to_chat(body, "up")


def test_web_search_says_how_codex_leaves_it_out() -> None:
    with pytest.raises(TranslationError, match='web_search = "disabled"'):
        responses_to_chat({"input": "hi", "tools": [{"type": "web_search", "external_web_access": False}]}, "up")


def _chat(message: dict[str, Any], finish: str = "stop", usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "up",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": usage or {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


@pytest.mark.parametrize(
    ("chat", "request_body", "status", "output"),
    [
        pytest.param(_chat({"content": "Hello"}), {"input": "hi"}, "completed",
                     [{"type": "message", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]}],
                     id="text"),
        pytest.param(_chat({"content": "He"}, "length"), {"input": "hi"}, "incomplete",
                     [{"type": "message", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "He", "annotations": [], "logprobs": []}]}],
                     id="length-is-incomplete"),
        pytest.param(_chat({"content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
            "tool_calls"), {"input": "hi", "tools": [FN]}, "completed",
                     [{"type": "function_call", "status": "completed", "arguments": '{"city":"Oslo"}',
                       "call_id": "call_1", "name": "get_weather"}], id="tool-call"),
        pytest.param(_chat({"content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "crm__find", "arguments": "{}"}}]},
            "tool_calls"),
                     {"input": "hi", "tools": [{"type": "namespace", "name": "crm", "description": "",
                                                "tools": [{"type": "function", "name": "find"}]}]}, "completed",
                     [{"type": "function_call", "status": "completed", "arguments": "{}", "call_id": "call_1",
                       "name": "find", "namespace": "crm"}], id="namespace-comes-back"),
        pytest.param(_chat({"content": None, "refusal": "No."}), {"input": "hi"}, "completed",
                     [{"type": "message", "role": "assistant", "status": "completed",
                       "content": [{"type": "refusal", "refusal": "No."}]}], id="refusal"),
    ],
)
def test_answer_translates(chat: dict[str, Any], request_body: dict[str, Any], status: str,
                           output: list[dict[str, Any]]) -> None:
    response = chat_to_response(chat, request_body, "up")
    Response.model_validate(response)  # the SDK's own type takes it
    assert response["status"] == status
    assert [{k: v for k, v in item.items() if k != "id"} for item in response["output"]] == output
    assert response["usage"]["input_tokens"] == 5 and response["usage"]["output_tokens"] == 2
    assert response["model"] == "up" and response["id"].startswith("resp_")


def test_cached_and_reasoning_tokens_keep_their_place() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 6},
             "completion_tokens_details": {"reasoning_tokens": 3}}
    response = chat_to_response(_chat({"content": "x"}, usage=usage), {"input": "hi"}, "up")
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 6
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
    assert response["usage"]["total_tokens"] == 14


EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def _events(data: bytes) -> list[Any]:
    out = []
    for block in data.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(EVENTS.validate_python(orjson.loads(line[6:])))
    return out


def _tool_chunk(index: int, call_id: str | None, name: str | None, arguments: str) -> bytes:
    function: dict[str, Any] = {"arguments": arguments}
    if name:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "function": function}
    if call_id:
        call["id"] = call_id
        call["type"] = "function"
    return sse({"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})


USAGE_CHUNK = sse({"id": "c", "object": "chat.completion.chunk", "choices": [],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}})
ROLE_ONLY = sse({"id": "c", "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})


@pytest.mark.parametrize(
    ("chunks", "types"),
    [
        pytest.param([ROLE_ONLY, chunk_event("Hel"), chunk_event("lo"), chunk_event("", "stop"), USAGE_CHUNK,
                      b"data: [DONE]\n\n"],
                     ["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                      "response.output_text.done", "response.content_part.done", "response.output_item.done",
                      "response.completed"], id="text"),
        pytest.param([chunk_event("Sure."), _tool_chunk(0, "call_1", "get_weather", ""),
                      _tool_chunk(0, None, None, '{"ci'),
                      _tool_chunk(0, None, None, 'ty":"Oslo"}'), _tool_chunk(1, "call_2", "get_weather", "{}"),
                      chunk_event("", "tool_calls"), USAGE_CHUNK, b"data: [DONE]\n\n"],
                     ["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                      "response.content_part.done", "response.output_item.done", "response.output_item.added",
                      "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                      "response.function_call_arguments.done", "response.output_item.done",
                      "response.output_item.added", "response.function_call_arguments.delta",
                      "response.function_call_arguments.done", "response.output_item.done", "response.completed"],
                     id="text-then-two-tool-calls"),
        pytest.param([chunk_event("He"), chunk_event("", "length"), b"data: [DONE]\n\n"],
                     ["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                      "response.content_part.done", "response.output_item.done", "response.incomplete"],
                     id="length-ends-incomplete"),
        pytest.param([chunk_event("", "stop"), b"data: [DONE]\n\n"],
                     ["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added", "response.output_text.done", "response.content_part.done",
                      "response.output_item.done", "response.completed"], id="empty-answer-is-an-empty-message"),
    ],
)
def test_stream_events_in_order(chunks: list[bytes], types: list[str]) -> None:
    translator = ChatStreamToResponses({"input": "hi", "tools": [FN]}, "up")
    data = b"".join(translator.feed(piece) for piece in chunks)
    assert translator.done
    events = _events(data)
    assert [e.type for e in events] == types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output and all(item.status == "completed" for item in final.output)


def test_stream_carries_arguments_and_usage() -> None:
    translator = ChatStreamToResponses({"input": "hi", "tools": [FN]}, "up")
    chunks = [_tool_chunk(0, "call_1", "get_weather", '{"city":'), _tool_chunk(0, None, None, '"Oslo"}'),
              chunk_event("", "tool_calls"), USAGE_CHUNK, b"data: [DONE]\n\n"]
    # one byte at a time: the framing must not depend on read boundaries
    data = b"".join(translator.feed(bytes([b])) for piece in chunks for b in piece)
    events = _events(data)
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == '{"city":"Oslo"}' and done.name == "get_weather"
    final = events[-1].response
    assert final.output[0].call_id == "call_1"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (9, 3)
    assert translator.usage == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


def test_a_role_only_first_chunk_sends_nothing_yet() -> None:
    translator = ChatStreamToResponses({"input": "hi"}, "up")
    assert translator.feed(ROLE_ONLY) == b""


def test_finish_without_done_completes_after_a_finish_reason_only() -> None:
    cut = ChatStreamToResponses({"input": "hi"}, "up")
    cut.feed(chunk_event("Hel"))
    assert cut.finish() == b"" and not cut.done
    ended = ChatStreamToResponses({"input": "hi"}, "up")
    ended.feed(chunk_event("Hel") + chunk_event("", "stop"))
    assert _events(ended.finish())[-1].type == "response.completed" and ended.done


def test_a_broken_stream_ends_with_error_then_failed() -> None:
    translator = ChatStreamToResponses({"input": "hi"}, "up")
    first = translator.feed(chunk_event("Hel"))
    with pytest.raises(ResponsesStreamError) as info:
        translator.feed(chunk_event("lo") + sse({"error": {"message": "overloaded", "type": "server_error"}}))
    events = _events(first + info.value.partial + translator.error_event("gpt: the stream failed"))
    assert [e.type for e in events][-5:] == ["response.output_text.done", "response.content_part.done",
                                             "response.output_item.done", "error", "response.failed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.message == "gpt: the stream failed"
    assert events[-1].response.output[0].status == "incomplete"
