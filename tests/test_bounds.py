"""proxy/bounds.py: JSON's depth and containers read from its bytes agree with a walk of the parsed value.

The byte reader (``json_structure``, ``json_deeper_than``) stands in for the walk wherever JSON is judged for
depth (request bodies, buffered answers, stream events) and counts a request body's containers before it
is parsed; a row here is a way the bytes could mislead: brackets and quotes inside strings, escapes
before a quote, empty and adjacent strings, and the two ways the depth is summed (innermost pairs removed,
then the running sum of what is left).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.bounds import MAX_CHUNK_DEPTH, containers_past, deeper_than, json_deeper_than, json_structure


def containers(value: Any) -> int:
    """The objects and arrays in ``value``, by a walk (a stack: a chain past Python's recursion limit)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            count += 1
            stack.extend(item.values() if isinstance(item, dict) else item)
    return count


CHAIN = b"[" * 600 + b"]" * 600
BUSHY = orjson.dumps([{"token": "a", "bytes": [97], "top": [{"t": "b", "bytes": [98]}] * 5}] * 300)

ROWS = [
    pytest.param(b'{"a": "[[[[[[", "b": [1]}', 2, id="brackets-in-a-string"),
    pytest.param(b'{"a": "]]]]]]", "b": [[[1]]]}', 3, id="closing-brackets-in-a-string-hide-nothing"),
    pytest.param(b'{"a": "\\"[[[[\\"", "b": [[1]]}', 2, id="escaped-quotes-around-brackets"),
    pytest.param(b'{"a": "\\\\", "b": [[[1]]]}', 3, id="an-escaped-backslash-before-the-quote"),
    pytest.param(b'{"a": "\\\\\\"[[", "b": [[[[1]]]]}', 3, id="escaped-backslash-then-escaped-quote"),
    pytest.param(b'{"a": "x\\\\\\\\", "b": "[[[["}', 1, id="two-escaped-backslashes-end-the-string"),
    pytest.param(b'{"": "", "[": "]", "b": ["", "[[", ""]}', 1, id="empty-and-adjacent-strings"),
    pytest.param(b'["[", "", "]", [[]]]', 2, id="an-empty-string-between-bracket-strings"),
    pytest.param(b'{"k[{": {"k}]": {"k": []}}}', 3, id="brackets-in-keys"),
    pytest.param(b'{"a": "\\u005b\\u005b\\u005b", "b": "\\/[\\n"}', 1, id="unicode-and-other-escapes"),
    pytest.param(orjson.dumps({"s": "caf\u00e9 {[", "t": [{"u": ["]"]}]}), 3, id="utf8-and-closing-in-strings"),
    pytest.param(b' \n [ \t { "a" : [ ] } ] ', 2, id="whitespace-between-tokens"),
    pytest.param(b"[" * 512 + b"]" * 512, MAX_CHUNK_DEPTH, id="a-chain-at-the-limit"),
    pytest.param(b"[" * 513 + b"]" * 513, MAX_CHUNK_DEPTH, id="a-chain-one-past-it"),
    pytest.param(b"[" + BUSHY + b"," + CHAIN + b"]", MAX_CHUNK_DEPTH, id="bushy-then-a-chain-past-the-limit"),
    pytest.param(b"[" + BUSHY + b"," + b"[" * 507 + b"]" * 507 + b"]", MAX_CHUNK_DEPTH,
                 id="bushy-then-a-chain-at-the-limit"),
    pytest.param(BUSHY, 4, id="bushy-at-its-depth"),
    pytest.param(BUSHY, 3, id="bushy-past-a-lower-limit"),
    pytest.param(orjson.dumps({"x": "[{" * 5000, "y": [[[[]]]]}), MAX_CHUNK_DEPTH, id="text-of-brackets-is-shallow"),
]


@pytest.mark.parametrize(("raw", "limit"), ROWS)
def test_the_bytes_read_the_depth_the_walk_reads(raw: bytes, limit: int) -> None:
    assert json_deeper_than(raw, limit) == deeper_than(orjson.loads(raw), limit)


@pytest.mark.parametrize(("raw", "limit"), ROWS)
def test_the_bytes_count_the_containers_the_walk_counts(raw: bytes, limit: int) -> None:
    structure = json_structure(raw)
    assert set(structure) <= set(b"[]")
    assert structure.count(b"[") == containers(orjson.loads(raw)) == structure.count(b"]")


@pytest.mark.parametrize(("raw", "built"), [
    pytest.param(b'{"a": [[[], [' + b"[]," * 50 + b'"unterminated', 55, id="cut-inside-a-string"),
    pytest.param(b'[[], [], {"a": [1, 2 x', 5, id="garbage-after-containers"),
    pytest.param(b'[[], "\\"", [[]], nul', 4, id="an-escaped-quote-then-garbage"),
])
def test_invalid_json_counts_what_a_parser_builds_before_it_fails(raw: bytes, built: int) -> None:
    """A request body is counted before it is parsed: of one orjson refuses, every container it would
    build before the error is counted (the prefix it reads is valid JSON)."""
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    assert json_structure(raw).count(b"[") >= built


@pytest.mark.parametrize(("raw", "limit", "past"), [
    pytest.param(b"[" + b",".join([b"[]"] * 99) + b"]", 100, 0, id="at-the-limit"),
    pytest.param(b"[" + b",".join([b"[]"] * 100) + b"]", 100, 101, id="one-past-it"),
    pytest.param(b"[" + b",".join([b"{}"] * 100) + b"]", 100, 101, id="objects-count-too"),
    pytest.param(orjson.dumps({"text": "[{" * 500, "x": [[]]}), 100, 0, id="brackets-in-text-are-not-containers"),
    pytest.param(b"[" + b",".join([b"[]"] * 100), 100, 101, id="cut-json-counts-what-a-parser-builds"),
])
def test_containers_past_counts_from_the_bytes(raw: bytes, limit: int, past: int) -> None:
    assert containers_past(raw, limit) == past
    if past:
        assert past == containers(orjson.loads(raw + b"]" * (raw.count(b"[") - raw.count(b"]"))))
