"""Chat answers to Responses, buffered and streamed, checked against the openai SDK's own event types."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.translate.chat_to_responses import ChatStreamToResponses, ResponsesStreamError, chat_to_response

from ..conftest import FN, chunk_event, sse


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
