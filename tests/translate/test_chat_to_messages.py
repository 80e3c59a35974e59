from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from proxy.translate.chat_to_messages import OpenAIStreamError, OpenAIStreamToAnthropic, openai_to_anthropic_response


def completion(message: dict[str, Any], finish: str, **usage: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700,
        "model": "gpt-x",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, **usage},
    }


def message(content: list[dict[str, Any]], stop: str, **usage: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "type": "message",
        "role": "assistant",
        "model": "chat",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5, **usage},
    }


CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param(
            completion({"role": "assistant", "content": "Hello!"}, "stop"),
            message([{"type": "text", "text": "Hello!"}], "end_turn"),
            id="text-stop-is-end-turn",
        ),
        pytest.param(
            completion({"role": "assistant", "content": "Hel"}, "length"),
            message([{"type": "text", "text": "Hel"}], "max_tokens"),
            id="length-is-max-tokens",
        ),
        pytest.param(
            completion({"role": "assistant", "content": None, "tool_calls": [CALL]}, "tool_calls"),
            message([{"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}], "tool_use"),
            id="tool-calls-are-tool-use",
        ),
        pytest.param(
            completion({"role": "assistant", "content": "Sure.", "tool_calls": [CALL]}, "tool_calls"),
            message(
                [
                    {"type": "text", "text": "Sure."},
                    {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
                ],
                "tool_use",
            ),
            id="text-then-tool-use",
        ),
        pytest.param(
            completion({"role": "assistant", "content": ""}, "content_filter"),
            message([], "refusal"),
            id="content-filter-is-refusal",
        ),
        pytest.param(
            completion(
                {"role": "assistant", "content": "x"},
                "stop",
                prompt_tokens_details={"cached_tokens": 4},
            ),
            message([{"type": "text", "text": "x"}], "end_turn", input_tokens=6, cache_read_input_tokens=4),
            id="cached-prompt-tokens-counted-apart",
        ),
    ],
)
def test_openai_to_anthropic_response(body: dict[str, Any], want: dict[str, Any]) -> None:
    got = openai_to_anthropic_response(body, "chat")
    assert got == want
    Message.model_validate(got)


# --- stream -----------------------------------------------------------------------------------


def sse(chunks: list[Any]) -> bytes:
    return b"".join(b"data: " + (c.encode() if isinstance(c, str) else orjson.dumps(c)) + b"\n\n" for c in chunks)


def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "chatcmpl-9",
        "object": "chat.completion.chunk",
        "created": 1700,
        "model": "gpt-x",
        "choices": choices,
        **extra,
    }


USAGE = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}

TEXT_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hello"}),
    chunk({"content": "! Ça va?"}),
    chunk({}, "stop"),
    chunk(None, usage=USAGE),
    "[DONE]",
]

TOOL_STREAM = [
    chunk({"role": "assistant", "content": None}),
    chunk({"content": "Checking."}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
    chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "now", "arguments": "{}"}}]}),
    chunk({}, "tool_calls"),
    chunk(None, usage=USAGE),
    "[DONE]",
]

START = {
    "type": "message_start",
    "message": {
        "id": "chatcmpl-9",
        "type": "message",
        "role": "assistant",
        "model": "chat",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    },
}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": value}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(stop: str, input_tokens: int = 30, output_tokens: int = 12) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


TEXT_EVENTS = [
    START,
    block_start(0, {"type": "text", "text": ""}),
    delta(0, {"type": "text_delta", "text": "Hello"}),
    delta(0, {"type": "text_delta", "text": "! Ça va?"}),
    block_stop(0),
    *end("end_turn"),
]

TOOL_EVENTS = [
    START,
    block_start(0, {"type": "text", "text": ""}),
    delta(0, {"type": "text_delta", "text": "Checking."}),
    block_stop(0),
    block_start(1, {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}}),
    delta(1, {"type": "input_json_delta", "partial_json": '{"city":'}),
    delta(1, {"type": "input_json_delta", "partial_json": ' "Paris"}'}),
    block_stop(1),
    block_start(2, {"type": "tool_use", "id": "call_b", "name": "now", "input": {}}),
    delta(2, {"type": "input_json_delta", "partial_json": "{}"}),
    block_stop(2),
    *end("tool_use"),
]


def events(out: bytes) -> list[dict[str, Any]]:
    """Each Anthropic event's data, checking its ``event:`` line names the same type."""
    items = []
    for raw in out.split(b"\n\n")[:-1]:
        name_line, data_line = raw.split(b"\n")
        data = orjson.loads(data_line.removeprefix(b"data: "))
        assert name_line == b"event: " + data["type"].encode()
        items.append(data)
    return items


def final_message(items: list[dict[str, Any]]) -> Any:
    """What the anthropic SDK builds from these events (validating each one)."""
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    snapshot = None
    bufs: dict[int, bytes] = {}
    for item in items:
        event = adapter.validate_python(item)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    return snapshot


@pytest.mark.parametrize("size", [1, 5, 1 << 20], ids=lambda n: f"pieces-of-{n}-bytes")
@pytest.mark.parametrize(
    ("chunks", "want"),
    [
        pytest.param(TEXT_STREAM, TEXT_EVENTS, id="text-with-usage-chunk"),
        pytest.param(TOOL_STREAM, TOOL_EVENTS, id="text-then-two-tool-calls"),
    ],
)
def test_stream_translation(chunks: list[Any], want: list[dict[str, Any]], size: int) -> None:
    translator = OpenAIStreamToAnthropic("chat")
    data = sse(chunks)
    out = b"".join(translator.feed(data[i : i + size]) for i in range(0, len(data), size))
    assert events(out) == want
    assert translator.done
    assert translator.usage == USAGE


def test_stream_is_what_the_anthropic_sdk_accumulates() -> None:
    translator = OpenAIStreamToAnthropic("chat")
    final = final_message(events(translator.feed(sse(TOOL_STREAM))))
    assert [block.type for block in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[1].input == {"city": "Paris"}
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == (
        "tool_use",
        30,
        12,
    )


def test_stream_without_usage_or_content() -> None:
    translator = OpenAIStreamToAnthropic("chat")
    out = translator.feed(sse([chunk({"role": "assistant"}), chunk({}, "length"), "[DONE]"]))
    assert events(out) == [START, *end("max_tokens", 0, 0)]
    assert translator.usage is None


def test_stream_starts_on_the_first_chunk() -> None:
    translator = OpenAIStreamToAnthropic("chat")
    assert events(translator.feed(sse(TEXT_STREAM[:1]))) == [START]
    assert not translator.done


def test_finish_without_done_closes_only_after_a_finish_reason() -> None:
    translator = OpenAIStreamToAnthropic("chat")
    translator.feed(sse(TEXT_STREAM[:3]))
    assert translator.finish() == b""
    assert not translator.done
    translator.feed(sse(TEXT_STREAM[3:5]))
    assert events(translator.finish()) == [block_stop(0), *end("end_turn")]
    assert translator.done


@pytest.mark.parametrize(
    ("calls", "blocks"),
    [
        pytest.param(
            [("call_a", 0, "f", '{"x":'), ("call_a", 0, None, " 1}")],
            [("call_a", "f", '{"x":'), (None, None, " 1}")],
            id="id-repeated-on-every-fragment-stays-one-block",
        ),
        pytest.param(
            [("call_a", 0, "f", "{}"), ("call_b", 0, "g", "{}")],
            [("call_a", "f", "{}"), ("call_b", "g", "{}")],
            id="new-id-at-the-same-index-opens-a-block",
        ),
    ],
)
def test_stream_tool_call_fragments(
    calls: list[tuple[str | None, int, str | None, str]],
    blocks: list[tuple[str | None, str | None, str]],
) -> None:
    chunks = [
        chunk({"tool_calls": [{"index": i, "id": c, "function": {"name": n, "arguments": a}}]}) for c, i, n, a in calls
    ]
    translator = OpenAIStreamToAnthropic("chat")
    got = events(translator.feed(sse(chunks)))
    seen = []
    for event in got:
        if event["type"] == "content_block_start":
            block = event["content_block"]
            seen.append((block["id"], block["name"]))
        elif event["type"] == "content_block_delta":
            seen.append(event["delta"]["partial_json"])
    want: list[Any] = []
    for call_id, name, args in blocks:
        if call_id is not None:
            want.append((call_id, name))
        want.append(args)
    assert seen == want


def test_stream_error_payload_raises() -> None:
    translator = OpenAIStreamToAnthropic("chat")
    translator.feed(sse(TEXT_STREAM[:2]))
    with pytest.raises(OpenAIStreamError) as caught:
        translator.feed(sse([{"error": {"message": "boom", "type": "server_error"}}]))
    assert (caught.value.message, caught.value.type) == ("boom", "server_error")
