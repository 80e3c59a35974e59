"""translate/tokens.py: counts made safe to add up, and the one estimate of a request's size."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.providers.base import Call
from proxy.server.counting import estimate_input_tokens
from proxy.server.request import estimate_tokens as context_estimate
from proxy.translate.tokens import estimate_tokens, text_chars, token_count

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 40_000}}
TOOL = {"name": "get_weather", "description": "the weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"messages": [{"role": "user", "content": "x" * 400}]}, id="plain-text"),
        pytest.param({"system": "be brief " * 10, "messages": [{"role": "user", "content": "hello " * 30}]},
                     id="system-string"),
        pytest.param({"system": [{"type": "text", "text": "s" * 80, "cache_control": {"type": "ephemeral"}}],
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "t" * 120}]}]},
                     id="system-blocks-and-text-parts"),
        pytest.param({"messages": [{"role": "user", "content": "x" * 40}], "tools": [TOOL]}, id="tool-schemas"),
        pytest.param({"messages": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "what is it"}]}]},
                     id="base64-image-is-not-text"),
    ],
)
def test_the_context_check_and_count_tokens_size_a_body_alike(body: dict[str, Any]) -> None:
    """Two estimators gave the same body two sizes (count_tokens counted tool schemas, the context
    check did not); there is one now, and the context check adds only the completion budget."""
    call = Call("messages", {**body, "max_tokens": 100}, stream=False)
    assert context_estimate(call) == estimate_input_tokens(body) + 100


@pytest.mark.parametrize(
    ("parts", "chars"),
    [
        pytest.param(("hello",), 5, id="a-string"),
        pytest.param(([{"role": "user", "content": "abcd"}],), 4, id="role-is-structure"),
        pytest.param(([{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 99}}],), 0,
                     id="openai-image-is-not-text"),
        pytest.param(([IMAGE],), 0, id="anthropic-image-is-not-text"),
        pytest.param((None, 3, 2.5), 0, id="no-text"),
    ],
)
def test_text_chars_counts_only_what_a_model_reads(parts: tuple[Any, ...], chars: int) -> None:
    assert sum(text_chars(p) for p in parts) == chars
    assert estimate_tokens(*parts) == chars // 4


@pytest.mark.parametrize(
    ("value", "count"),
    [
        pytest.param(12, 12, id="int"),
        pytest.param("12", 12, id="digit-string"),
        pytest.param(-3, 0, id="negative"),
        pytest.param(1.5, 0, id="float"),
        pytest.param("9" * 16, 0, id="too-many-digits"),
        pytest.param(None, 0, id="null"),
    ],
)
def test_a_strange_count_costs_only_itself(value: object, count: int) -> None:
    assert token_count(value) == count
