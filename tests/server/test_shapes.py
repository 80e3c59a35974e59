"""Client bodies checked at the edge: a 400 naming the field, never a 500 from a translator.

The named cases are the ones a hostile round found as 500s with tracebacks; the fuzz is a
seeded, bounded run of malformed bodies (``tests/edge_fuzz.py``) against every POST endpoint
of a gateway with a route per target kind, over loopback with a raw client (so a header may
carry bytes that are not UTF-8).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.config import load_config
from proxy.gateway import Gateway
from proxy.server.shapes import WrongShape, check_body

from ..conftest import Proxy
from ..edge_fuzz import BODIES, ROUTES, AnyApi, cases, fuzz_config

SHIPPED = Path(__file__).resolve().parents[2] / "routes.yaml"
FUZZ_SEED = 31
FUZZ_CASES = 2000
CHAT_MESSAGES = [{"role": "user", "content": "hi"}]
OURS = ("invalid_type", "missing_required_parameter", "invalid_pin")  # the edge's own refusals


@pytest.mark.parametrize(("op", "body", "param", "says"), [
    pytest.param("chat", {"messages": None}, "messages", "expected an array of message objects, but got null",
                 id="chat-messages-null"),
    pytest.param("chat", {}, "messages", "Missing required parameter: 'messages'", id="chat-messages-missing"),
    pytest.param("chat", {"messages": [{"role": "user", "content": 1}]}, "messages[0].content",
                 "expected a string or an array of content parts, but got an integer", id="chat-content-number"),
    pytest.param("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
                 "messages[0].content[0].image_url.url", "Missing required parameter", id="chat-image-without-url"),
    pytest.param("chat", {"messages": CHAT_MESSAGES, "n": True}, "n", "expected an integer, but got a boolean",
                 id="chat-n-boolean"),
    pytest.param("chat", {"messages": CHAT_MESSAGES, "max_tokens": 1e30}, "max_tokens",
                 "expected an integer, but got a number", id="chat-max-tokens-huge"),
    pytest.param("chat", {"messages": CHAT_MESSAGES, "stop": [1]}, "stop[0]", "expected a string, but got an integer",
                 id="chat-stop-list-of-numbers"),
    pytest.param("chat", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": 5}}]}]},
                 "messages[0].tool_calls[0].function.arguments", "expected a string or an object",
                 id="chat-tool-arguments-number"),
    pytest.param("messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": [7]}]}]},
                 "messages[0].content[0].content[0]", "expected a content block object, but got an integer",
                 id="messages-tool-result-nesting"),
    pytest.param("messages", {"messages": CHAT_MESSAGES, "system": [{"type": "text", "text": None}, "x"]},
                 "system[1]", "expected a content block object, but got a string", id="messages-system-item"),
    pytest.param("responses", {"tools": [{"type": "namespace", "tools": [3]}]}, "tools[0].tools[0]",
                 "expected a tool object", id="responses-namespace-tool"),
    pytest.param("responses", {"text": {"format": []}}, "text.format", "expected an object, but got an array",
                 id="responses-format-array"),
    pytest.param("embeddings", {"input": [[1, "x"]]}, "input[0][1]", "expected an integer, but got a string",
                 id="embeddings-token-array"),
])
def test_a_body_of_the_wrong_shape_names_its_field(op: str, body: dict[str, Any], param: str, says: str) -> None:
    with pytest.raises(WrongShape) as caught:
        check_body(op, {"model": "chat", **body})
    assert caught.value.param == param
    assert says in caught.value.message()


@pytest.mark.parametrize(("path", "body"), [pytest.param(path, body, id=path) for path, body in BODIES.items()])
def test_every_field_of_a_full_valid_body_passes(path: str, body: dict[str, Any]) -> None:
    op = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings",
          "/v1/responses": "responses"}.get(path, "messages")
    check_body(op, body)  # raises if the table refuses a body the APIs accept


async def raw_post(port: int, path: str, body: bytes, headers: dict[str, Any]) -> tuple[int, bytes, bytes]:
    """POST over a raw socket (header values as bytes, sent as they are); (status, head, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n".encode()
    for name, value in headers.items():
        head += name.encode() + b": " + (value if isinstance(value, bytes) else value.encode()) + b"\r\n"
    writer.write(head + b"\r\n" + body)
    try:
        data = await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head_bytes.lower():
        rest = _dechunked(rest)
    return int(head_bytes.split(b" ", 2)[1]), head_bytes, rest


def _dechunked(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2:]
    return out


def error_of(path: str, body: bytes) -> dict[str, Any]:
    """The error object of a refusal in its endpoint's shape (Anthropic's under /v1/messages)."""
    data = orjson.loads(body)
    if path.startswith("/v1/messages"):
        assert data["type"] == "error" and isinstance(data["error"]["type"], str)
    else:
        assert set(data["error"]) == {"message", "type", "param", "code"}
    assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    return data["error"]


@pytest.fixture
async def shipped():
    p = await Proxy(Gateway(load_config(SHIPPED))).start()
    yield p
    await p.stop()


@pytest.mark.parametrize(("path", "body", "headers", "param"), [
    pytest.param("/v1/chat/completions", b'{"model": "chat", "messages": null}', {}, "messages", id="messages-null"),
    pytest.param("/v1/chat/completions", b'{"model": "chat", "messages": 1}', {}, "messages", id="messages-number"),
    pytest.param("/v1/chat/completions", b'{"model": "chat", "messages": [], "tools": 1}', {}, "tools",
                 id="tools-number"),
    pytest.param("/v1/chat/completions", b'{"model": "chat", "messages": [], "stop": 5}', {}, "stop",
                 id="stop-number"),
    pytest.param("/v1/messages", b'{"model": "chat", "max_tokens": 5, "messages": [["x"]]}', {}, "messages[0]",
                 id="messages-api-nested-list"),
    pytest.param("/v1/messages/count_tokens", b'{"model": "chat", "messages": [["x"]]}', {}, "messages[0]",
                 id="count-tokens-nested-list"),
    pytest.param("/v1/responses", b'{"model": "chat", "input": "hi", "tools": ["x"]}', {}, "tools[0]",
                 id="responses-tools-strings"),
    pytest.param("/v1/responses", b'{"model": "chat", "input": 1}', {}, "input", id="responses-input-number"),
    pytest.param("/v1/completions", b'{"model": "chat", "prompt": "hi", "stop": true}', {}, "stop",
                 id="completions-stop-true"),
    pytest.param("/v1/chat/completions", b'{"model": "chat", "messages": []}', {"x-route-provider": b"sim-\xff"},
                 "x-route-provider", id="route-provider-not-utf8"),
    pytest.param("/v1/messages", b'{"model": "chat", "max_tokens": 5, "messages": []}',
                 {"x-route-provider": b"caf\xc3\xa9"}, "x-route-provider", id="route-provider-not-ascii"),
])
async def test_the_named_malformed_bodies_are_400s_naming_the_field(shipped, caplog, path, body, headers, param):
    status, _, answer = await raw_post(shipped.port, path, body, headers)
    assert status == 400, answer
    error = error_of(path, answer)
    assert error["type"] == "invalid_request_error" and f"'{param}'" in error["message"]
    if not path.startswith("/v1/messages"):  # Anthropic's shape has no param
        assert error["param"] == param
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.parametrize(("path", "body"), [
    pytest.param("/v1/completions", {"prompt": "hi", "messages": True, "tools": 1}, id="completions-with-messages"),
    pytest.param("/v1/embeddings", {"input": "hi", "messages": 1, "stream_options": []}, id="embeddings-with-messages"),
])
async def test_a_field_another_endpoint_defines_is_not_read_here(shipped, caplog, path, body):
    """The simulator read ``messages`` on any body (a 500 for ``messages: true`` on completions)."""
    status, _, answer = await raw_post(shipped.port, path, orjson.dumps({"model": "chat", **body}), {})
    assert status == 200, answer
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.fixture
async def every_kind(upstreams):
    up = await upstreams(AnyApi.handlers())
    p = await Proxy(Gateway(load_config_dict(fuzz_config(up.url)))).start()
    yield p
    await p.stop()


def load_config_dict(raw: dict[str, Any]):
    from proxy.config import parse_config

    return parse_config(raw, {})


@pytest.mark.parametrize("route", ROUTES)
async def test_a_full_valid_body_is_served_on_every_kind(every_kind, route):
    """The table refuses nothing the APIs accept: each endpoint's fullest body, buffered and streamed."""
    for path, body in BODIES.items():
        if route == "claude" and path in ("/v1/completions", "/v1/embeddings"):
            continue  # Anthropic targets serve neither: an untranslatable 400, not the table's
        for stream in (False, True) if path not in ("/v1/embeddings", "/v1/messages/count_tokens") else (False,):
            if route == "claude":  # JSON output with tools has no Anthropic equivalent: untranslatable there
                body = {k: v for k, v in body.items() if k not in ("text", "response_format")}
            sent = orjson.dumps({**body, "model": route, "stream": stream})
            status, _, answer = await raw_post(every_kind.port, path, sent, {"content-type": "application/json"})
            assert status == 200, (path, route, stream, answer[:400])
            assert b"stream_interrupted" not in answer


@pytest.mark.timeout(180)
async def test_a_fuzz_of_malformed_bodies_gets_no_5xx_on_any_endpoint(every_kind, caplog):
    """FUZZ_CASES bodies from FUZZ_SEED: every answer below 500, every refusal in its endpoint's error
    shape, the edge's own with ``param`` set, no stream broken by what its body said, no traceback."""
    caplog.set_level(logging.ERROR, logger="firstbyte")
    generated = list(cases(FUZZ_SEED, FUZZ_CASES))
    seen: dict[int, int] = {}
    queue: asyncio.Queue[tuple[int, tuple[str, bytes, dict[str, Any]]]] = asyncio.Queue()
    for item in enumerate(generated):
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            index, (path, body, headers) = queue.get_nowait()
            status, _, answer = await raw_post(every_kind.port, path, body, headers)
            where = f"case {index} of seed {FUZZ_SEED}: {path} {body[:200]!r} {headers}"
            seen[status] = seen.get(status, 0) + 1
            assert status < 500, f"{where} -> {status} {answer[:300]!r}"
            if status >= 400:
                error = error_of(path, answer)
                if error.get("code") in OURS:
                    assert error["param"], where
            else:
                assert b"stream_interrupted" not in answer, f"{where} -> {answer[-300:]!r}"

    await asyncio.gather(*(worker() for _ in range(4)))
    assert sum(seen.values()) == FUZZ_CASES
    assert seen.get(400, 0) > FUZZ_CASES // 4 and seen.get(200, 0) > FUZZ_CASES // 10, seen  # both kinds ran
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records][:5]
