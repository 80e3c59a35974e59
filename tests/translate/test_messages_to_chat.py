from __future__ import annotations

from typing import Any

import pytest

from proxy.translate.chat_to_anthropic import TranslationError
from proxy.translate.messages_to_chat import anthropic_to_openai_request

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather now",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_FUNCTION = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def request(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "max_tokens": 256, "messages": messages, **extra}


def expected(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": messages, "max_tokens": 256, **extra}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param(request([user("hi")]), expected([user("hi")]), id="plain-text"),
        pytest.param(
            request(
                [user("hi")],
                system=[
                    {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "Use French."},
                ],
            ),
            expected(
                [{"role": "system", "content": "Be brief.\n\nUse French."}, user("hi")],
            ),
            id="system-blocks-become-one-system-message",
        ),
        pytest.param(
            request(
                [
                    user(
                        [
                            {"type": "text", "text": "What is in these?"},
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                            },
                            {"type": "image", "source": {"type": "url", "url": "https://x/a.jpg"}},
                        ]
                    )
                ]
            ),
            expected(
                [
                    user(
                        [
                            {"type": "text", "text": "What is in these?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": f"data:image/png;base64,{PNG}"},
                            },
                            {"type": "image_url", "image_url": {"url": "https://x/a.jpg"}},
                        ]
                    )
                ]
            ),
            id="images-become-image-url-parts",
        ),
        pytest.param(
            request(
                [
                    user("Weather in Paris?"),
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "hm", "signature": "sig"},
                            {"type": "text", "text": "Checking."},
                            {
                                "type": "tool_use",
                                "id": "toolu_1",
                                "name": "get_weather",
                                "input": {"city": "Paris"},
                            },
                            {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
                        ],
                    },
                    user(
                        [
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_2",
                                "content": [
                                    {"type": "text", "text": "noon"},
                                    {
                                        "type": "image",
                                        "source": {"type": "url", "url": "https://x/clock.png"},
                                    },
                                ],
                            },
                            {"type": "text", "text": "And tomorrow?"},
                        ]
                    ),
                ],
                tools=[WEATHER_TOOL],
                tool_choice={"type": "auto"},
            ),
            expected(
                [
                    user("Weather in Paris?"),
                    {
                        "role": "assistant",
                        "content": "Checking.",
                        "tool_calls": [
                            {
                                "id": "toolu_1",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city":"Paris"}',
                                },
                            },
                            {
                                "id": "toolu_2",
                                "type": "function",
                                "function": {"name": "now", "arguments": "{}"},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
                    {"role": "tool", "tool_call_id": "toolu_2", "content": "noon"},
                    user(
                        [
                            {"type": "image_url", "image_url": {"url": "https://x/clock.png"}},
                            {"type": "text", "text": "And tomorrow?"},
                        ]
                    ),
                ],
                tools=[WEATHER_FUNCTION],
                tool_choice="auto",
            ),
            id="tool-use-and-results-with-image-moved-to-user",
        ),
        pytest.param(
            request(
                [
                    user("go"),
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                    },
                    user([{"type": "tool_result", "tool_use_id": "t"}]),
                ]
            ),
            expected(
                [
                    user("go"),
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    },
                    {"role": "tool", "tool_call_id": "t", "content": ""},
                ]
            ),
            id="tool-use-only-and-empty-result",
        ),
        pytest.param(
            request(
                [user("hi"), {"role": "assistant", "content": "Sure:"}],
                temperature=0.3,
                top_p=0.9,
                top_k=40,
                stop_sequences=["END"],
                stream=True,
                metadata={"user_id": "u-42"},
            ),
            expected(
                [user("hi"), {"role": "assistant", "content": "Sure:"}],
                temperature=0.3,
                top_p=0.9,
                stop=["END"],
                stream=True,
                stream_options={"include_usage": True},
                user="u-42",
            ),
            id="sampling-stop-stream-asks-usage-top-k-dropped",
        ),
    ],
)
def test_anthropic_to_openai_request(body: dict[str, Any], want: dict[str, Any]) -> None:
    assert anthropic_to_openai_request(body, "gpt-x") == want


@pytest.mark.parametrize(
    ("choice", "want"),
    [
        pytest.param({"type": "auto"}, {"tool_choice": "auto"}, id="auto"),
        pytest.param({"type": "any"}, {"tool_choice": "required"}, id="any-is-required"),
        pytest.param({"type": "none"}, {"tool_choice": "none"}, id="none"),
        pytest.param(
            {"type": "tool", "name": "get_weather"},
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            id="named-tool",
        ),
        pytest.param(
            {"type": "auto", "disable_parallel_tool_use": True},
            {"tool_choice": "auto", "parallel_tool_calls": False},
            id="no-parallel-calls",
        ),
        pytest.param(None, {}, id="absent"),
    ],
)
def test_tool_choice(choice: dict[str, Any] | None, want: dict[str, Any]) -> None:
    out = anthropic_to_openai_request(request([user("hi")], tools=[WEATHER_TOOL], tool_choice=choice), "gpt-x")
    assert out == expected([user("hi")], tools=[WEATHER_FUNCTION], **want)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        pytest.param(request([user([{"type": "document", "source": {}}])]), "document", id="document-block"),
        pytest.param(
            request([user("hi")], tools=[{"type": "web_search_20250305", "name": "web_search"}]),
            "server tool",
            id="server-tool",
        ),
        pytest.param(request([{"role": "system", "content": "x"}]), "role", id="system-role-turn"),
    ],
)
def test_untranslatable_request(body: dict[str, Any], words: str) -> None:
    with pytest.raises(TranslationError, match=words):
        anthropic_to_openai_request(body, "gpt-x")


def test_a_system_prompt_with_a_non_text_block_is_refused_in_anthropics_words() -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "system": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}
    with pytest.raises(TranslationError, match=r"^only text blocks can be translated here") as info:
        anthropic_to_openai_request(body, "m")
    assert info.value.param == "system"
