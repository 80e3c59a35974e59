"""The error shape per endpoint, decided in ``server/dialect.py``: OpenAI's on the OpenAI
endpoints (the Responses API included), Anthropic's under ``/v1/messages``, whatever built the
error, a refusal, a wrong method or an unhandled exception. Real server on loopback."""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from proxy.server.dialect import to_anthropic as openai_error_to_anthropic

from ..conftest import route_config

SIM = {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0, "chunk_ms": 0, "chunks": 3}}
ASK = {"model": "chat", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug in firstbyte")


async def _sim_proxy(proxy, keys: str | None = None):
    raw = route_config([{"provider": "sim", "model": "sim-1"}], {"sim": SIM})
    if keys is None:
        return await proxy(raw)
    return await proxy({**raw, "clients": {"keys_env": "KEYS"}}, env={"KEYS": keys})


def _is_anthropic(body: bytes, kind: str) -> bool:
    data = orjson.loads(body)
    return data["type"] == "error" and data["error"]["type"] == kind and isinstance(data["error"]["message"], str)


def _openai_code(body: bytes) -> str:
    data = orjson.loads(body)
    assert set(data["error"]) == {"message", "type", "param", "code"}
    return data["error"]["code"]


async def _send(url: str, method: str, path: str, headers: dict[str, str] | None = None,
                body: Any = None) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else orjson.dumps(body)
    async with aiohttp.ClientSession() as session, session.request(
        method, url + path, data=data, headers=headers or {}
    ) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_an_internal_error_on_messages_is_anthropics(proxy, monkeypatch):
    p = await _sim_proxy(proxy)
    monkeypatch.setattr(p.gateway, "rng", _boom)  # any bug on the request's way in
    async with anthropic.AsyncAnthropic(base_url=p.url, api_key="x", max_retries=0) as client:
        with pytest.raises(anthropic.InternalServerError) as info:
            await client.messages.create(**ASK)
        assert info.value.status_code == 500
        assert info.value.body == {"type": "error", "error": {
            "type": "api_error", "message": "firstbyte failed to handle this request; the error is in its log."}}
        assert info.value.response.headers["x-request-id"]


async def test_an_internal_error_on_count_tokens_is_anthropics(proxy, monkeypatch):
    p = await _sim_proxy(proxy)
    monkeypatch.setattr(p.gateway, "rng", _boom)
    async with anthropic.AsyncAnthropic(base_url=p.url, api_key="x", max_retries=0) as client:
        with pytest.raises(anthropic.InternalServerError) as info:
            await client.messages.count_tokens(model="chat", messages=[{"role": "user", "content": "hi"}])
        assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "api_error"


@pytest.mark.parametrize("path", [
    pytest.param("/v1/chat/completions", id="chat"),
    pytest.param("/v1/responses", id="responses"),
])
async def test_an_internal_error_on_the_openai_endpoints_stays_openais(proxy, monkeypatch, path):
    p = await _sim_proxy(proxy)
    monkeypatch.setattr(p.gateway, "rng", _boom)
    status, _, body = await _send(p.url, "POST", path, body={**ASK, "input": "hi"})
    assert status == 500 and _openai_code(body) == "internal_error"


async def test_the_openai_sdk_reads_an_internal_error(proxy, monkeypatch):
    p = await _sim_proxy(proxy)
    monkeypatch.setattr(p.gateway, "rng", _boom)
    async with openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.responses.create(model="chat", input="hi")
        assert info.value.code == "internal_error"


@pytest.mark.parametrize(("method", "path"), [
    pytest.param("GET", "/v1/messages", id="get-messages"),
    pytest.param("PUT", "/v1/messages", id="put-messages"),
    pytest.param("GET", "/v1/messages/count_tokens", id="get-count-tokens"),
])
async def test_a_wrong_method_on_messages_is_anthropics(proxy, method, path):
    p = await _sim_proxy(proxy)
    status, headers, body = await _send(p.url, method, path)
    assert status == 405 and headers["Allow"] == "POST"
    assert _is_anthropic(body, "invalid_request_error")


@pytest.mark.parametrize(("method", "path"), [
    pytest.param("GET", "/v1/messages", id="get-messages"),
    pytest.param("GET", "/v1/messages/count_tokens", id="get-count-tokens"),
    pytest.param("GET", "/v1/messages/batches", id="anthropic-batches"),
])
async def test_a_wrong_method_on_messages_behind_keys_is_refused_in_anthropics_shape(proxy, method, path):
    p = await _sim_proxy(proxy, keys="k1")
    status, _, body = await _send(p.url, method, path)
    assert status == 401 and _is_anthropic(body, "authentication_error")
    status, _, body = await _send(p.url, method, path, {"x-api-key": "k1"})
    assert status in (404, 405) and _is_anthropic(body, "not_found_error" if status == 404 else
                                                  "invalid_request_error")


async def test_the_anthropic_sdk_reads_a_refused_key_on_a_wrong_path(proxy):
    p = await _sim_proxy(proxy, keys="k1")
    async with anthropic.AsyncAnthropic(base_url=p.url, api_key="wrong", max_retries=0) as client:
        with pytest.raises(anthropic.AuthenticationError) as info:
            await client.messages.batches.list()
        assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(("method", "path", "status"), [
    pytest.param("GET", "/v1/chat/completions", 405, id="chat-405"),
    pytest.param("GET", "/v1/responses", 405, id="responses-405"),
    pytest.param("POST", "/v1/images/generations", 404, id="images-404"),
])
async def test_the_openai_endpoints_refuse_in_openais_shape(proxy, method, path, status):
    p = await _sim_proxy(proxy, keys="k1")
    got, _, body = await _send(p.url, method, path)
    assert got == 401 and _openai_code(body) == "invalid_api_key"
    got, _, body = await _send(p.url, method, path, {"authorization": "Bearer k1"})
    assert got == status and _openai_code(body) in ("http_405", "unsupported_endpoint")


# --- errors -----------------------------------------------------------------------------------


def openai_error(message: str, kind: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


@pytest.mark.parametrize(
    ("status", "body", "want"),
    [
        pytest.param(400, openai_error("bad"), ("invalid_request_error", "bad"), id="400"),
        pytest.param(401, openai_error("no key"), ("authentication_error", "no key"), id="401"),
        pytest.param(403, openai_error("no"), ("permission_error", "no"), id="403"),
        pytest.param(404, openai_error("what"), ("not_found_error", "what"), id="404"),
        pytest.param(413, openai_error("big"), ("request_too_large", "big"), id="413"),
        pytest.param(429, openai_error("slow", "rate_limit"), ("rate_limit_error", "slow"), id="429"),
        pytest.param(500, openai_error("oops"), ("api_error", "oops"), id="500"),
        pytest.param(503, openai_error("none"), ("overloaded_error", "none"), id="503"),
        pytest.param(504, openai_error("late"), ("timeout_error", "late"), id="504"),
        pytest.param(418, openai_error("tea"), ("invalid_request_error", "tea"), id="other-4xx"),
        pytest.param(
            529,
            orjson.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "O"}}),
            ("overloaded_error", "O"),
            id="already-anthropic-shape-passes-through",
        ),
        pytest.param(502, b"Bad Gateway", ("api_error", "upstream answered 502: Bad Gateway"), id="non-json"),
    ],
)
def test_openai_error_to_anthropic(status: int, body: bytes, want: tuple[str, str]) -> None:
    kind, text = want
    assert orjson.loads(openai_error_to_anthropic(status, body)) == {
        "type": "error",
        "error": {"type": kind, "message": text},
    }
