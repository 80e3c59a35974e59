"""Hostile client input: encoded bodies, deep JSON, forged model names, odd keys. Raw sockets where a
client library would tidy the input away; every refusal in the OpenAI error shape."""

from __future__ import annotations

import asyncio
import gc
import gzip
import re
import time
import zlib
from types import FrameType

import aiohttp
import orjson
import pytest

from proxy.bounds import MAX_BODY_CONTAINERS, MAX_JSON_DEPTH, WALK_BYTES_PER_BRACKET, deeper_than, json_deeper_than
from proxy.routing.decision import parse_header
from proxy.server.listener import LINGER

from ..conftest import assert_openai_error, exchange, ok_handler, openai_provider, post_head, route_config

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def gateway(upstreams, proxy):
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                     "max_body_bytes": 2**20})
    return up, p


@pytest.mark.timeout(20)
async def test_a_gzip_body_is_bounded_by_its_decoded_size(gateway):
    """Under 1 MiB of gzip (the limit) that inflates to 300 MiB: 413, nothing forwarded."""
    up, p = gateway
    inflated = orjson.dumps({**CHAT, "pad": ""})[:-2] + b' ' * (300 * 2**20) + b'""}'
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = compressor.compress(inflated) + compressor.flush()
    assert len(bomb) < 2**20
    status, _, body = await exchange(p.port, post_head(len(bomb), extra=b"Content-Encoding: gzip\r\n"), bomb)
    err = assert_openai_error(status, body, 413, "request_too_large")
    assert "1048576" in str(err["message"])
    assert str(err["message"]).startswith("Request body is larger than 1048576 bytes;")  # where reading stopped
    assert up.calls == []


def _gzip_bomb(size: int) -> bytes:
    """About ``size`` bytes of gzip that inflate a thousandfold: one fully flushed megabyte of spaces
    repeated (each flush starts afresh, so its compressed bytes repeat too), with no end."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = b" " * 2**20
    head = compressor.compress(orjson.dumps(CHAT)[:-1] + b', "pad": "' + spaces) + compressor.flush(zlib.Z_FULL_FLUSH)
    unit = compressor.compress(spaces) + compressor.flush(zlib.Z_FULL_FLUSH)
    return head + unit * ((size - len(head)) // len(unit))


@pytest.mark.timeout(30)
async def test_the_rest_of_a_refused_gzip_body_is_not_inflated(gateway):
    """A reviewer's bomb: 0.9 MB of gzip (under the 1 MiB limit) inflating to about 900 MB. Its 413 went out at
    once, but aiohttp's lingering close then read the rest and inflated it on the event loop (0.5 MB held
    /healthz 1.2 s on a firstbyte at the default limit). What follows the refusal is dropped unparsed."""
    up, p = gateway
    bomb = _gzip_bomb(900_000)
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(post_head(len(bomb), extra=b"Content-Encoding: gzip\r\n") + bomb)
    assert (await asyncio.wait_for(reader.read(12), 5)).startswith(b"HTTP/1.1 413")
    waits = []
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            start = time.perf_counter()
            async with session.get(p.url + "/healthz") as resp:
                assert resp.status == 200
            waits.append(time.perf_counter() - start)
            await asyncio.sleep(0.05)
    await asyncio.wait_for(reader.read(), 5)  # the rest of the 413, then the close after the linger
    writer.close()
    assert max(waits) < 0.4, waits
    assert up.calls == []


async def test_a_refused_gzip_bomb_leaves_no_cycle_for_the_collector(gateway):
    """read_body raised its refusal from a local: a frame holding its own exception is a cycle, and it kept the
    request, its connection and its inflater (0.77 MB a refused gzip bomb of 8 MiB) till the collector ran,
    which firstbyte's thresholds make rare: 60 bombs grew the process 46 MB (scripts/gzip_bomb_rss.py). (aiohttp's
    own lingering task, cancelled at the close, leaves a cycle of its frames too, and a body that is no gzip one of
    the reader's exception and its traceback: neither holds inflated bytes.)"""
    up, p = gateway
    payload = _gzip_bomb(20_000)
    gc.collect()
    gc.disable()
    try:
        got, _, _ = await exchange(p.port, post_head(len(payload), extra=b"Content-Encoding: gzip\r\n"), payload)
        await asyncio.sleep(LINGER + 0.2)  # the refused connection's linger is over: it is closed
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kept = [o.f_code.co_name for o in gc.garbage if isinstance(o, FrameType) and o.f_code.co_name == "read_body"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert got == 413
    assert kept == []


async def test_a_small_gzip_body_is_decoded_and_served(gateway):
    up, p = gateway
    packed = gzip.compress(orjson.dumps(CHAT))
    status, headers, body = await exchange(p.port, post_head(len(packed), extra=b"Content-Encoding: gzip\r\n"),
                                           packed)
    assert status == 200, body
    assert up.calls[-1]["json"]["messages"] == CHAT["messages"]


@pytest.mark.parametrize(
    ("encoding", "payload", "code"),
    [
        pytest.param(b"gzip", b"this is not gzip at all", "invalid_body", id="gzip-that-is-not"),
        pytest.param(b"deflate", b"\x00\x01\x02 nor deflate", "invalid_body", id="deflate-that-is-not"),
        pytest.param(b"x-unheard-of", orjson.dumps(CHAT), "unsupported_encoding", id="unknown-encoding"),
    ],
)
async def test_a_body_that_cannot_be_decoded_is_a_400(gateway, encoding, payload, code):
    up, p = gateway
    status, _, body = await exchange(p.port, post_head(len(payload), extra=b"Content-Encoding: %s\r\n" % encoding),
                                     payload)
    assert_openai_error(status, body, 400, code)
    assert up.calls == []


async def test_json_nested_hundreds_deep_is_a_400_not_a_500(gateway):
    """orjson reads 1,024 levels but writes 254: a body in between used to fail on its way upstream."""
    up, p = gateway
    deep = orjson.dumps(CHAT)[:-1] + b', "metadata": ' + b"[" * 300 + b"]" * 300 + b"}"
    status, _, body = await p.post("/v1/chat/completions", deep)
    err = assert_openai_error(status, body, 400, "invalid_json")
    assert "128" in str(err["message"])
    assert up.calls == []


WIDE = b",".join([b"[]"] * 25_000)  # brackets enough for the depth to be read from the bytes


@pytest.mark.parametrize(
    ("raw", "limit"),
    [
        pytest.param(b'{"a": "[[[[[[", "b": [1]}', 2, id="brackets-in-a-string-are-not-structure"),
        pytest.param(b'{"a": "\\"[[[[\\"", "b": [[1]]}', 2, id="an-escaped-quote-stays-in-its-string"),
        pytest.param(b'{"a": "\\\\", "b": [[[1]]]}', 3, id="an-escaped-backslash-ends-before-the-quote"),
        pytest.param(b'{"a": "\\\\", "b": [[[[1]]]]}', 3, id="deeper-after-an-escaped-backslash"),
        pytest.param(b'[' * 130 + b']' * 130, MAX_JSON_DEPTH, id="a-chain-past-the-limit"),
        pytest.param(b'{"x": [' + WIDE + b'], "y": ' + b'[' * 128 + b']' * 128 + b'}', MAX_JSON_DEPTH,
                     id="wide-then-at-the-limit"),
        pytest.param(b'{"x": [' + WIDE + b'], "y": ' + b'{"k":' * 129 + b'1' + b'}' * 129 + b'}', MAX_JSON_DEPTH,
                     id="wide-then-objects-past-it"),
        pytest.param(orjson.dumps({"s": "caf\u00e9 {[", "t": [{"u": ["]"]}]}), 3, id="unicode-and-closing-in-strings"),
    ],
)
def test_the_bytes_read_the_depth_the_walk_reads(raw, limit):
    assert json_deeper_than(raw, limit) == deeper_than(orjson.loads(raw), limit)


@pytest.mark.parametrize(("tail", "status"), [
    pytest.param(b'[' * 127 + b']' * 127, 400, id="deep"),  # under the body and its metadata: 129 levels
    pytest.param(b'[' * 126 + b']' * 126, 200, id="at-the-limit"),
])
async def test_a_body_of_many_brackets_is_read_for_depth_by_its_bytes(gateway, tail, status):
    """1.3M empty arrays (3.9 MB) held the loop 3 s while the walk visited each; with more brackets than a
    500th of its bytes the depth is read from the bytes: still refused when deep, served when not."""
    up, p = gateway
    raw = orjson.dumps(CHAT)[:-1] + b', "metadata": {"wide": [' + WIDE + b'], "tail": ' + tail + b'}}'
    assert raw.count(b"[") * WALK_BYTES_PER_BRACKET > len(raw)
    got, _, body = await p.post("/v1/chat/completions", raw)
    if status == 400:
        assert "128" in str(assert_openai_error(got, body, 400, "invalid_json")["message"])
    else:
        assert got == 200, body


async def test_a_body_nested_past_the_parsers_own_limit_is_told_as_too_deep_not_as_invalid(gateway):
    """A reviewer's body: valid JSON 2,000 levels deep. orjson stops at 1,024 and the client read "Request body
    is not valid JSON: depth limit exceeded: line 1 column 1093" for a body that is valid; it is the same
    400 a body 200 levels deep gets, naming the gateway's limit."""
    up, p = gateway
    raw = orjson.dumps(CHAT)[:-1] + b', "tools": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    got, _, body = await p.post("/v1/chat/completions", raw)
    message = str(assert_openai_error(got, body, 400, "invalid_json")["message"])
    assert message == f"Request body nests JSON deeper than {MAX_JSON_DEPTH} levels.", message
    assert up.calls == []


async def test_a_request_with_many_brackets_but_shallow_passes(gateway):
    up, p = gateway
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object",
              "properties": {"a": {"type": "array", "items": {"type": "string"}}}}}} for i in range(60)]
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "tools": tools})
    assert status == 200, body


def _containers(n: int) -> bytes:
    """A chat body of exactly ``n`` JSON objects and arrays (its own five and empty arrays)."""
    return orjson.dumps(CHAT)[:-1] + b', "metadata": {"wide": [' + b",".join([b"[]"] * (n - 5)) + b"]}}"


@pytest.mark.parametrize(("raw", "status"), [
    pytest.param(_containers(MAX_BODY_CONTAINERS), 200, id="at-the-cap"),
    pytest.param(_containers(MAX_BODY_CONTAINERS + 1), 400, id="one-past-it"),
    pytest.param(orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "[{" * MAX_BODY_CONTAINERS}]}),
                 200, id="brackets-in-text-are-not-containers"),
    pytest.param(_containers(MAX_BODY_CONTAINERS + 1)[:-3], 400, id="cut-json-past-it-is-counted-too"),
])
async def test_a_body_of_more_containers_than_the_cap_is_refused_before_it_is_parsed(gateway, raw, status):
    """1.3M empty arrays (3.9 MB, under the default max_body_bytes) held the event loop ~0.5 s while orjson
    built them: past MAX_BODY_CONTAINERS the body is refused from its bytes' count, in the OpenAI shape."""
    up, p = gateway
    got, _, body = await p.post("/v1/chat/completions", raw)
    if status == 200:
        assert got == 200, body[:300]
        return
    err = assert_openai_error(got, body, 400, "too_many_containers")
    assert f"{MAX_BODY_CONTAINERS:,}" in str(err["message"]) and "split" in str(err["message"]), err
    count = re.search(r"holds ([\d,]+) JSON", str(err["message"]))
    assert count is not None and count[1] == f"{int(count[1].replace(',', '')):,}", err  # as the limit is printed
    assert up.calls == []


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("up/ok; served=evil", id="header-field-forged"),
        pytest.param("up/ok, other(200 0.01s)", id="item-forged"),
        pytest.param("up/mod\u00e8le", id="non-ascii"),
        pytest.param("up/" + "m" * 900_000, id="900-KB-name"),
        pytest.param("up/ok\u2028x", id="unicode-line-separator"),
    ],
)
async def test_a_model_that_would_break_the_header_is_refused(gateway, model):
    up, p = gateway
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "model": model})
    err = assert_openai_error(status, body, 400, "invalid_model")
    assert err["param"] == "model"
    assert "x-route-decision" not in headers
    assert up.calls == []


async def test_crlf_in_model_is_a_400_not_an_empty_reply(gateway):
    up, p = gateway
    payload = orjson.dumps({**CHAT, "model": "up/ok\r\nx-injected: 1"})
    status, headers, body = await exchange(p.port, post_head(len(payload)), payload)
    assert_openai_error(status, body, 400, "invalid_model")
    assert "x-injected" not in headers
    assert up.calls == []


async def test_a_plain_pin_still_routes_and_parses(gateway):
    up, p = gateway
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "model": "up/llama-3.3:70b@v1"})
    assert status == 200, body
    decision = parse_header(headers["x-route-decision"])
    assert decision.route == "up/llama-3.3:70b@v1" and decision.served == "up"


async def test_a_client_key_that_is_not_utf8_is_a_401_not_a_500(upstreams, proxy):
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    raw = {**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
           "clients": {"keys_env": "KEYS"}}
    p = await proxy(raw, {"KEYS": "client-key-1"})
    payload = orjson.dumps(CHAT)
    status, _, body = await exchange(p.port, post_head(len(payload), extra=b"Authorization: Bearer \xff\xfe\x80\r\n"),
                                     payload)
    assert_openai_error(status, body, 401, "invalid_api_key")
    status, _, body = await exchange(p.port, post_head(len(payload), extra=b"Authorization: Bearer client-key-1\r\n"),
                                     payload)
    assert status == 200, body
