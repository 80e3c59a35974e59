from __future__ import annotations

import time
from typing import Any

import pytest

from proxy.translate.chat_to_anthropic import TranslationError, openai_to_anthropic_request

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def request(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": messages, **extra}


def expected(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-x", "messages": messages, "max_tokens": 1024, **extra}


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
WEATHER_TOOL_OUT = {
    "name": "get_weather",
    "description": "Weather now",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param(
            request([user("hi")]),
            expected([user("hi")]),
            id="plain-text-gets-default-max-tokens",
        ),
        pytest.param(
            request(
                [
                    {"role": "system", "content": "Be brief."},
                    {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
                    user("hi"),
                    {"role": "system", "content": "Late rule."},
                ]
            ),
            expected([user("hi")], system="Be brief.\n\nUse French.\n\nLate rule."),
            id="several-system-messages-joined-into-top-level-system",
        ),
        pytest.param(
            request(
                [
                    user(
                        [
                            {"type": "text", "text": "What is in these?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": f"data:image/png;base64,{PNG}"},
                            },
                            {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
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
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": PNG,
                                },
                            },
                            {
                                "type": "image",
                                "source": {"type": "url", "url": "https://x.test/a.jpg"},
                            },
                        ]
                    )
                ]
            ),
            id="images-from-data-and-https-urls",
        ),
        pytest.param(
            request(
                [
                    user("Weather in Paris and Rome?"),
                    {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                    {
                        "role": "tool",
                        "tool_call_id": "call_2",
                        "content": [{"type": "text", "text": "21C"}],
                    },
                    user("And tomorrow?"),
                ],
                tools=[WEATHER_TOOL],
            ),
            expected(
                [
                    user("Weather in Paris and Rome?"),
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "Checking."},
                            {
                                "type": "tool_use",
                                "id": "call_1",
                                "name": "get_weather",
                                "input": {"city": "Paris"},
                            },
                        ],
                    },
                    user(
                        [
                            {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                            {
                                "type": "tool_result",
                                "tool_use_id": "call_2",
                                "content": [{"type": "text", "text": "21C"}],
                            },
                            {"type": "text", "text": "And tomorrow?"},
                        ]
                    ),
                ],
                tools=[WEATHER_TOOL_OUT],
            ),
            id="tool-calls-and-results-merged-into-one-user-turn",
        ),
        pytest.param(
            request(
                [
                    user("go"),
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "function": {"name": "f", "arguments": "{oops"}},
                            {"id": "c2", "function": {"name": "g", "arguments": ""}},
                        ],
                    },
                ]
            ),
            expected(
                [
                    user("go"),
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "c1",
                                "name": "f",
                                "input": {"_raw": "{oops"},
                            },
                            {"type": "tool_use", "id": "c2", "name": "g", "input": {}},
                        ],
                    },
                ]
            ),
            id="broken-tool-arguments-kept-under-raw",
        ),
        pytest.param(
            request([user("a"), user("b"), {"role": "assistant", "content": ""}, user("c")]),
            expected([user([{"type": "text", "text": t} for t in "abc"])]),
            id="consecutive-user-turns-merged-and-empty-assistant-dropped",
        ),
        pytest.param(
            request(
                [user("hi")],
                max_tokens=50,
                max_completion_tokens=70,
                temperature=1.5,
                top_p=0.9,
                stop="END",
                stream=True,
                user="u-42",
            ),
            expected(
                [user("hi")],
                max_tokens=70,
                temperature=1,
                top_p=0.9,
                stop_sequences=["END"],
                stream=True,
                metadata={"user_id": "u-42"},
            ),
            id="sampling-stop-stream-user-and-clamped-temperature",
        ),
        pytest.param(
            request([user("hi")], max_tokens=50, stop=["a", "b"], temperature=0.2),
            expected([user("hi")], max_tokens=50, stop_sequences=["a", "b"], temperature=0.2),
            id="max-tokens-and-stop-list",
        ),
    ],
)
def test_openai_to_anthropic_request(body: dict[str, Any], want: dict[str, Any]) -> None:
    assert openai_to_anthropic_request(body, "claude-x", 1024) == want


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        pytest.param({}, None, id="no-choice-stays-absent"),
        pytest.param({"tool_choice": "auto"}, {"type": "auto"}, id="auto"),
        pytest.param({"tool_choice": "required"}, {"type": "any"}, id="required-is-any"),
        pytest.param({"tool_choice": "none"}, {"type": "none"}, id="none-keeps-tools"),
        pytest.param(
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            {"type": "tool", "name": "get_weather"},
            id="named-function",
        ),
        pytest.param(
            {"parallel_tool_calls": False},
            {"type": "auto", "disable_parallel_tool_use": True},
            id="no-parallel-calls",
        ),
        pytest.param(
            {"tool_choice": "required", "parallel_tool_calls": False},
            {"type": "any", "disable_parallel_tool_use": True},
            id="required-without-parallel-calls",
        ),
    ],
)
def test_tool_choice(extra: dict[str, Any], want: dict[str, Any] | None) -> None:
    out = openai_to_anthropic_request(request([user("hi")], tools=[WEATHER_TOOL], **extra), "m", 8)
    assert out["tools"] == [WEATHER_TOOL_OUT]
    assert out.get("tool_choice") == want


def test_tool_choice_without_tools_is_dropped() -> None:
    out = openai_to_anthropic_request(request([user("hi")], tool_choice="auto"), "m", 8)
    assert "tool_choice" not in out


@pytest.mark.parametrize(
    ("body", "words"),
    [
        pytest.param(
            request([user([{"type": "input_audio", "input_audio": {}}])]),
            "input_audio",
            id="audio-part",
        ),
        pytest.param(
            request([user([{"type": "image_url", "image_url": {"url": "data:image/png,xyz"}}])]),
            "base64",
            id="data-url-not-base64",
        ),
        pytest.param(
            request([user([{"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}])]),
            "http",
            id="image-url-scheme",
        ),
        pytest.param(request([{"role": "function", "content": "x"}]), "role", id="unknown-role"),
        pytest.param(request([user("hi")], tools=[{"type": "code_interpreter"}]), "function", id="tool-kind"),
        pytest.param(request([user("hi")], n=2), "n > 1", id="several-choices"),
    ],
)
def test_untranslatable_request(body: dict[str, Any], words: str) -> None:
    with pytest.raises(TranslationError, match=words):
        openai_to_anthropic_request(body, "m", 8)


def test_a_system_message_with_a_non_text_part_is_refused_in_openais_words() -> None:
    image = {"type": "image_url", "image_url": {"url": "x"}}
    body = {"model": "m", "messages": [{"role": "system", "content": [image]}, {"role": "user", "content": "hi"}]}
    with pytest.raises(TranslationError, match=r"^only text parts can be translated here") as info:
        openai_to_anthropic_request(body, "claude-x", 1024)
    assert info.value.param == "messages[0]"


def test_many_messages_of_one_role_merge_in_linear_time() -> None:
    """120,000 one-line user messages (3.6 MB, under the body bound) are one turn of 120,000 blocks in
    order. Copying the turn at each merge took minutes and held the event loop (a reviewer's /healthz
    waited 40 s); growing it in place takes well under a second, so the bound below is far from both."""
    body = {"messages": [{"role": "user", "content": f"m{i}"} for i in range(120_000)]}
    t0 = time.perf_counter()
    out = openai_to_anthropic_request(body, "claude", 1024)
    took = time.perf_counter() - t0
    (turn,) = out["messages"]
    assert turn["role"] == "user" and len(turn["content"]) == 120_000
    assert turn["content"][0]["text"] == "m0" and turn["content"][-1]["text"] == "m119999"
    assert took < 5, took


def test_merging_turns_leaves_the_clients_body_as_it_was() -> None:
    """The merged list is the translation's own: a failover to another kind reads the body unchanged."""
    first = [{"type": "text", "text": "a"}]
    body = {"messages": [{"role": "user", "content": first}, {"role": "user", "content": "b"}]}
    out = openai_to_anthropic_request(body, "claude", 1024)
    assert [b["text"] for b in out["messages"][0]["content"]] == ["a", "b"]
    assert first == [{"type": "text", "text": "a"}] and body["messages"][0]["content"] is first
