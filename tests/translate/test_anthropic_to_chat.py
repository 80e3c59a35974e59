from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from proxy.translate.anthropic_to_chat import (
    AnthropicStreamError,
    AnthropicStreamToOpenAI,
    anthropic_error_to_openai,
    anthropic_to_openai_response,
    is_anthropic_context_overflow,
)
from proxy.translate.sse import SseDecoder


def message(content: list[dict[str, Any]], stop: str, **usage: int) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5, **usage},
    }


def completion(msg: dict[str, Any], finish: str, prompt: int = 10, out: int = 5) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "object": "chat.completion",
        "created": 1700,
        "model": "chat",
        "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out},
    }


TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
TOOL_CALL = {
    "id": "toolu_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param(
            message([{"type": "text", "text": "Hello"}, {"type": "text", "text": "!"}], "end_turn"),
            completion({"role": "assistant", "content": "Hello!"}, "stop"),
            id="text-blocks-joined-end-turn-is-stop",
        ),
        pytest.param(
            message([{"type": "text", "text": "Hel"}], "max_tokens"),
            completion({"role": "assistant", "content": "Hel"}, "length"),
            id="max-tokens-is-length",
        ),
        pytest.param(
            message([{"type": "text", "text": "a"}], "stop_sequence"),
            completion({"role": "assistant", "content": "a"}, "stop"),
            id="stop-sequence-is-stop",
        ),
        pytest.param(
            message([TOOL_USE], "tool_use"),
            completion({"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}, "tool_calls"),
            id="tool-use-only-has-null-content",
        ),
        pytest.param(
            message([{"type": "text", "text": "Checking."}, TOOL_USE], "tool_use"),
            completion(
                {"role": "assistant", "content": "Checking.", "tool_calls": [TOOL_CALL]},
                "tool_calls",
            ),
            id="text-and-tool-use",
        ),
        pytest.param(
            message([], "end_turn"),
            completion({"role": "assistant", "content": ""}, "stop"),
            id="empty-answer-has-empty-content",
        ),
        pytest.param(
            message(
                [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "x"},
                ],
                "refusal",
            ),
            completion({"role": "assistant", "content": "x"}, "content_filter"),
            id="thinking-dropped-refusal-is-content-filter",
        ),
        pytest.param(
            message(
                [{"type": "text", "text": "x"}],
                "end_turn",
                cache_creation_input_tokens=100,
                cache_read_input_tokens=1000,
            ),
            completion({"role": "assistant", "content": "x"}, "stop", prompt=1110),
            id="cache-tokens-count-as-prompt",
        ),
    ],
)
def test_anthropic_to_openai_response(body: dict[str, Any], want: dict[str, Any]) -> None:
    got = anthropic_to_openai_response(body, "chat", created=1700)
    assert got == want
    ChatCompletion.model_validate(got)


# --- streams ----------------------------------------------------------------------------------


def sse(events: list[dict[str, Any]], newline: bytes = b"\n") -> bytes:
    out = b""
    for event in events:
        lines = [b"event: " + event["type"].encode(), b"data: " + orjson.dumps(event), b""]
        out += b"".join(line + newline for line in lines)
    return out


def msg_start(input_tokens: int = 25, **usage: int) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1nZd",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-x",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, **usage},
        },
    }


def text_delta(text: str, index: int = 0) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }


def json_delta(partial: str, index: int) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": partial},
    }


def msg_delta(stop: str, output_tokens: int) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


TEXT_STREAM = [
    msg_start(),
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    text_delta("Hello"),
    text_delta("! Ça va?"),
    {"type": "content_block_stop", "index": 0},
    msg_delta("end_turn", 15),
    {"type": "message_stop"},
]

TOOL_STREAM = [
    msg_start(472),
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    text_delta("Okay, checking:"),
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {
            "type": "tool_use",
            "id": "toolu_01T",
            "name": "get_weather",
            "input": {},
        },
    },
    json_delta("", 1),
    json_delta('{"location":', 1),
    json_delta(' "San Francisco, CA"}', 1),
    {"type": "content_block_stop", "index": 1},
    {
        "type": "content_block_start",
        "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_02U", "name": "get_time", "input": {}},
    },
    json_delta("{}", 2),
    {"type": "content_block_stop", "index": 2},
    msg_delta("tool_use", 89),
    {"type": "message_stop"},
]


def payloads(out: bytes) -> list[Any]:
    """The data of each OpenAI event, [DONE] as the string it is."""
    assert out.endswith(b"\n\n") or not out
    items = []
    for event in out.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ")
        data = event[len(b"data: ") :]
        items.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return items


def feed_in_pieces(translator: Any, data: bytes, size: int) -> bytes:
    return b"".join(translator.feed(data[i : i + size]) for i in range(0, len(data), size))


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "msg_1nZd",
        "object": "chat.completion.chunk",
        "created": 1700,
        "model": "chat",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "id": "msg_1nZd",
        "object": "chat.completion.chunk",
        "created": 1700,
        "model": "chat",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


TEXT_CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hello"}),
    chunk({"content": "! Ça va?"}),
    chunk({}, "stop"),
    usage_chunk(25, 15),
    "[DONE]",
]

TOOL_CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Okay, checking:"}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "toolu_01T",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"location":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "San Francisco, CA"}'}}]}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 1,
                    "id": "toolu_02U",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
    chunk({}, "tool_calls"),
    usage_chunk(472, 89),
    "[DONE]",
]


@pytest.mark.parametrize("size", [1, 2, 7, 64, 1 << 20], ids=lambda n: f"pieces-of-{n}-bytes")
@pytest.mark.parametrize(
    ("events", "newline", "want"),
    [
        pytest.param(TEXT_STREAM, b"\n", TEXT_CHUNKS, id="text-with-ping"),
        pytest.param(TEXT_STREAM, b"\r\n", TEXT_CHUNKS, id="text-with-crlf-lines"),
        pytest.param(TOOL_STREAM, b"\n", TOOL_CHUNKS, id="text-then-two-tool-uses"),
    ],
)
def test_stream_translation(events: list[dict[str, Any]], newline: bytes, want: list[Any], size: int) -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=True, created=1700)
    got = payloads(feed_in_pieces(translator, sse(events, newline), size))
    assert got == want
    assert translator.done
    for item in got[:-1]:
        ChatCompletionChunk.model_validate(item)


def test_stream_emits_each_event_as_soon_as_it_is_complete() -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=False, created=1700)
    data = sse(TEXT_STREAM)
    first_event_end = data.index(b"\n\n") + 2
    assert translator.feed(data[: first_event_end - 1]) == b""
    assert payloads(translator.feed(data[first_event_end - 1 : first_event_end])) == [TEXT_CHUNKS[0]]
    assert not translator.done


def test_stream_without_include_usage_still_counts() -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=False, created=1700)
    got = payloads(translator.feed(sse(TEXT_STREAM)))
    assert got == [*TEXT_CHUNKS[:4], "[DONE]"]
    assert translator.usage == {"prompt_tokens": 25, "completion_tokens": 15, "total_tokens": 40}


def test_stream_usage_known_from_message_start_and_cumulative_deltas() -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=True, created=1700)
    assert translator.usage is None
    translator.feed(sse([msg_start(10, cache_read_input_tokens=90)]))
    assert translator.usage == {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101}
    translator.feed(sse([msg_delta("max_tokens", 7)]))
    translator.feed(sse([{"type": "message_delta", "delta": {}, "usage": {"output_tokens": 9}}]))
    assert translator.usage == {"prompt_tokens": 100, "completion_tokens": 9, "total_tokens": 109}


def test_stream_error_event_mid_stream_raises() -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=True, created=1700)
    head = translator.feed(sse(TEXT_STREAM[:4]))
    assert [p["choices"][0]["delta"] for p in payloads(head)] == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
    ]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(AnthropicStreamError) as caught:
        translator.feed(sse([error]))
    assert (caught.value.message, caught.value.type) == ("Overloaded", "overloaded_error")
    assert not translator.done


def test_stream_malformed_event_raises() -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=True)
    with pytest.raises(AnthropicStreamError, match="malformed"):
        translator.feed(b"event: message_start\ndata: {not json\n\n")


def test_stream_stop_without_stop_reason_still_finishes() -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=False, created=1700)
    events = [msg_start(), text_delta("x"), {"type": "message_stop"}]
    got = payloads(translator.feed(sse(events)))
    assert got[-2:] == [chunk({}, "stop"), "[DONE]"]


def test_stream_ignores_unknown_events_and_anything_after_stop() -> None:
    translator = AnthropicStreamToOpenAI("chat", include_usage=False, created=1700)
    events = [
        msg_start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta"}},
        {"type": "some_future_event"},
        msg_delta("end_turn", 2),
        {"type": "message_stop"},
        text_delta("late"),
    ]
    got = payloads(translator.feed(b": comment\n\n" + sse(events)))
    assert got == [chunk({"role": "assistant", "content": ""}), chunk({}, "stop"), "[DONE]"]


def test_sse_decoder_joins_multi_line_data() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"event: x\ndata: a\ndata:b\n\nid: 3\n") == [("x", b"a\nb")]
    assert decoder.feed(b"data: c\n\n") == [(None, b"c")]


# --- errors -----------------------------------------------------------------------------------


def anthropic_error(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


OVERFLOW = anthropic_error("invalid_request_error", "prompt is too long: 208310 tokens > 200000")


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        pytest.param(
            529,
            anthropic_error("overloaded_error", "Overloaded"),
            {"message": "Overloaded", "type": "overloaded_error", "param": None, "code": None},
            id="overloaded-keeps-its-type",
        ),
        pytest.param(
            400,
            OVERFLOW,
            {
                "message": "prompt is too long: 208310 tokens > 200000",
                "type": "invalid_request_error",
                "param": None,
                "code": "context_length_exceeded",
            },
            id="overflow-gets-openai-code",
        ),
        pytest.param(
            502,
            b"<html>Bad Gateway</html>",
            {
                "message": "Anthropic upstream answered 502: <html>Bad Gateway</html>",
                "type": "upstream_error",
                "param": None,
                "code": "upstream_502",
            },
            id="non-json-body-wrapped",
        ),
        pytest.param(
            401,
            b"",
            {
                "message": "Anthropic upstream answered 401",
                "type": "authentication_error",
                "param": None,
                "code": "upstream_401",
            },
            id="empty-body",
        ),
    ],
)
def test_anthropic_error_to_openai(status: int, body: bytes, want: dict[str, Any]) -> None:
    assert orjson.loads(anthropic_error_to_openai(status, body)) == {"error": want}


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        pytest.param(400, OVERFLOW, True, id="prompt-too-long"),
        pytest.param(
            400,
            anthropic_error(
                "invalid_request_error",
                "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000",
            ),
            True,
            id="input-plus-max-tokens-exceed-limit",
        ),
        pytest.param(400, b"Prompt is too long", True, id="plain-text-body"),
        pytest.param(
            400,
            anthropic_error("invalid_request_error", "messages: roles must alternate"),
            False,
            id="other-bad-request",
        ),
        pytest.param(413, OVERFLOW, False, id="only-a-400-counts"),
    ],
)
def test_is_anthropic_context_overflow(status: int, body: bytes, want: bool) -> None:
    assert is_anthropic_context_overflow(status, body) is want
