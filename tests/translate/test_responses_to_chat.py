"""Responses requests to chat completions, as pure tables."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.translate.chat_to_anthropic import TranslationError
from proxy.translate.responses_to_chat import responses_to_chat

from ..conftest import FN

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
