"""Which OpenAI stream chunks are wrongly typed, and that the cheap search finds each of them."""

from __future__ import annotations

import itertools
import re
from typing import Any

import orjson
import pytest

from proxy.translate.chunk_types import RELAYED_SUSPECT, SUSPECT, chunk_problem


@pytest.mark.parametrize(("chunk", "problem"), [
    pytest.param({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}, None, id="text"),
    pytest.param({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, None, id="role"),
    pytest.param({"choices": [], "usage": {"prompt_tokens": 1}}, None, id="usage-only"),
    pytest.param({"error": {"message": "x"}}, None, id="an-error-is-not-judged-here"),
    pytest.param({"choices": [{"delta": {}, "logprobs": {"content": [{"token": "a"}]}}]}, None, id="logprobs-list"),
    pytest.param({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}, None, id="tool-calls"),
    pytest.param({"choices": [{"text": "hi", "finish_reason": "stop"}]}, None, id="completions"),
    pytest.param({"choices": "oops"}, "choices is a string, not a list", id="choices-string"),
    pytest.param({"choices": {"0": {}}}, "choices is an object, not a list", id="choices-object"),
    pytest.param({"choices": [5]}, "a choice is a number, not an object", id="choice-number"),
    pytest.param({"choices": [{"delta": "x"}]}, "delta is a string, not an object", id="delta-string"),
    pytest.param({"choices": [{"delta": {"content": 5}}]}, "delta.content is a number, not a string", id="content-5"),
    pytest.param({"choices": [{"delta": {"content": ["a"]}}]}, "delta.content is a list, not a string",
                 id="content-list"),
    pytest.param({"choices": [{"delta": {"role": True}}]}, "delta.role is a boolean, not a string", id="role-bool"),
    pytest.param({"choices": [{"delta": {"tool_calls": 5}}]}, "delta.tool_calls is a number, not a list",
                 id="tool-calls-number"),
    pytest.param({"choices": [{"delta": {}, "finish_reason": 1}]}, "a choice's finish_reason is a number, not a string",
                 id="finish-number"),
    pytest.param({"choices": [{"text": {"a": 1}}]}, "a choice's text is an object, not a string", id="text-object"),
])
def test_chunk_problem(chunk: dict[str, Any], problem: str | None) -> None:
    assert chunk_problem(chunk) == problem
    if problem is not None and "list, not a string" not in problem:  # a list is left to the parse's verdict
        assert SUSPECT.search(orjson.dumps(chunk)) is not None  # the tap's search finds it


@pytest.mark.parametrize("raw", [
    pytest.param(b'{"choices":[{"delta":{"content":"he said \\"content\\": 5"}}]}', id="quoted-in-text"),
    pytest.param(b'{"choices":[{"delta":{"content":null},"finish_reason":null}]}', id="nulls"),
    pytest.param(b'{"choices": [ {"delta": {"content": "a"}, "finish_reason": "stop"} ]}', id="spaced"),
])
def test_well_typed_chunks_are_not_suspect(raw: bytes) -> None:
    assert SUSPECT.search(raw) is None and chunk_problem(orjson.loads(raw)) is None


@pytest.mark.parametrize("raw", [
    pytest.param(b'{"choices":"oops"}', id="choices-string"),
    pytest.param(b'{"choices": {"0": {}}}', id="choices-object"),
    pytest.param(b'{"choices":[{"delta":{"content":5}}]}', id="content-number"),
    pytest.param(b'{"choices":[{"delta":{"content": true}}]}', id="content-bool"),
    pytest.param(b'{"choices":[{"delta":{"content":{"a":1}}}]}', id="content-object"),
])
def test_the_relayed_search_finds_what_client_sdks_trip_on_first(raw: bytes) -> None:
    """After the first token a passthrough stream is searched with the cheaper pattern only."""
    assert RELAYED_SUSPECT.search(raw) is not None and chunk_problem(orjson.loads(raw)) is not None


# SUSPECT as it was first spelt (one group for the string keys), kept to show the letter-by-letter
# spelling finds exactly what it found.
_GROUPED = re.compile(rb'"(?:choices"\s*:\s*(?:[^\[\sn]|\[\s*[^{\]\s])|(?:tool_calls"\s*:\s*[^\[\sn])'
                      rb'|delta"\s*:\s*[^{\sn]'
                      rb'|(?:content|role|refusal|reasoning_content|finish_reason|text)"\s*:\s*[^"\sn\[])')
_KEYS = (b"choices", b"tool_calls", b"delta", b"content", b"role", b"refusal", b"reasoning_content",
         b"finish_reason", b"text", b"cont", b"index", b"rolex")
_VALUES = (b'"a"', b"null", b"[]", b"[{}]", b"[1]", b"[ ]", b"{}", b"5", b"true", b'""', b"nope")


def test_the_suspect_search_finds_what_its_grouped_spelling_found() -> None:
    for key, value, colon in itertools.product(_KEYS, _VALUES, (b":", b" : ", b":\n")):
        for raw in (b'{"' + key + b'"' + colon + value + b"}", b'{"x":{"' + key + b'"' + colon + value + b"}}"):
            assert (SUSPECT.search(raw) is None) == (_GROUPED.search(raw) is None), raw
