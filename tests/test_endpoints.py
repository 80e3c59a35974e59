"""The endpoints clients call besides the routed ones: models/{id}, messages/count_tokens, the
404s of unserved API families in their own dialect; request ids and an access-log line for
every answer."""

from __future__ import annotations

import asyncio
import io
import json

import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from proxy.config import AccessLog as AccessLogConfig
from proxy.observe.accesslog import AccessLog

from .anthropic_fakes import anthropic_error, anthropic_provider
from .conftest import decision_of, ok_handler, openai_provider, parse_text, route_config, status_handler

SIM = {"kind": "simulated", "simulate": {"first_chunk_ms": 1, "jitter_ms": 0, "chunk_ms": 0, "chunks": 3}}


async def sim_proxy(proxy, **kwargs):
    return await proxy(route_config([{"provider": "sim", "model": "sim-1"}], {"sim": SIM}), **kwargs)


async def test_models_retrieve(proxy):
    p = await sim_proxy(proxy)
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0)
    model = await client.models.retrieve("chat")
    assert (model.id, model.object, model.owned_by) == ("chat", "model", "firstbyte")
    pinned = await client.models.retrieve("sim/any-model")
    assert (pinned.id, pinned.owned_by) == ("sim/any-model", "sim")
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("nope")
    assert info.value.code == "model_not_found" and "routes: chat" in info.value.message
    await client.close()


async def test_count_tokens_goes_to_an_anthropic_target(upstreams, proxy):
    async def count(request: web.Request) -> web.StreamResponse:
        return web.json_response({"input_tokens": 42})

    claude = await upstreams({"/v1/messages/count_tokens": count})
    p = await proxy(route_config([{"provider": "sim", "model": "sim-1"}, {"provider": "claude", "model": "claude-x"}],
                                 {"sim": SIM, "claude": anthropic_provider(claude.url, api_key_env="AK")}),
                    env={"AK": "secret"})
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="client", max_retries=0)
    raw = await client.messages.with_raw_response.count_tokens(
        model="chat", messages=[{"role": "user", "content": "hello"}])
    counted = await raw.parse()
    assert counted.input_tokens == 42 and raw.headers["x-token-count"] == "anthropic claude"
    sent = claude.calls[0]
    assert sent["json"] == {"model": "claude-x", "messages": [{"role": "user", "content": "hello"}]}
    assert sent["headers"]["x-api-key"] == "secret" and "client" not in sent["headers"].values()
    await client.close()


async def test_count_tokens_relays_an_answer_that_arrives_in_pieces_whole(upstreams, proxy):
    async def count(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"input_tokens": ')
        await asyncio.sleep(0.05)  # the rest in another read
        await response.write(b'42, "note": "' + b"n" * 3000 + b'"}')
        await response.write_eof()
        return response

    claude = await upstreams({"/v1/messages/count_tokens": count})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}],
                                 {"claude": anthropic_provider(claude.url)}))
    status, headers, body = await p.post("/v1/messages/count_tokens", {
        "model": "chat", "messages": [{"role": "user", "content": "hello"}]})
    assert status == 200 and headers["x-token-count"] == "anthropic claude"
    assert orjson.loads(body) == {"input_tokens": 42, "note": "n" * 3000}


async def test_count_tokens_estimates_when_no_anthropic_target_answers(upstreams, proxy):
    claude = await upstreams({"/v1/messages/count_tokens": anthropic_error(529, "overloaded_error", "busy")})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}, {"provider": "sim", "model": "s"}],
                                 {"claude": anthropic_provider(claude.url), "sim": SIM}))
    status, headers, body = await p.post("/v1/messages/count_tokens", {
        "model": "chat", "system": "x" * 40, "messages": [{"role": "user", "content": "y" * 40}]})
    assert status == 200
    assert orjson.loads(body) == {"input_tokens": 20, "estimated": True}
    assert headers["x-token-count"] == "estimate (claude (529))"


async def test_count_tokens_errors_are_anthropic_shaped(proxy):
    p = await sim_proxy(proxy)
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="client", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as info:
        await client.messages.count_tokens(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["error"]["type"] == "not_found_error"
    await client.close()


@pytest.mark.parametrize(
    ("path", "family"),
    [
        pytest.param("/v1/images/generations", "image generation", id="images"),
        pytest.param("/v1/audio/transcriptions", "audio", id="audio"),
        pytest.param("/v1/moderations", "moderations", id="moderations"),
        pytest.param("/v1/files", "files", id="files"),
        pytest.param("/v1/batches", "batches", id="batches"),
    ],
)
async def test_unserved_openai_families_are_a_clear_openai_404(proxy, path, family):
    p = await sim_proxy(proxy)
    status, headers, body = await p.post(path, {"model": "chat"})
    error = orjson.loads(body)["error"]
    assert status == 404 and error["code"] == "unsupported_endpoint"
    assert family in error["message"] and "/v1/chat/completions" in error["message"]
    assert {k.lower() for k in headers} >= {"x-request-id"}


async def test_the_openai_sdk_raises_not_found_on_images(proxy):
    p = await sim_proxy(proxy)
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        await client.moderations.create(input="hi")
    assert info.value.code == "unsupported_endpoint"
    await client.close()


async def test_anthropic_families_are_an_anthropic_404(proxy):
    p = await sim_proxy(proxy)
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as info:
        await client.messages.batches.list()
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "not_found_error"
    await client.close()


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        pytest.param("req-2026.12.03:abc_1", True, id="a-safe-token-is-kept"),
        pytest.param("has space", False, id="space"),
        pytest.param("semi;colon", False, id="header-grammar"),
        pytest.param("x" * 65, False, id="too-long"),
    ],
)
async def test_a_clients_request_id_is_the_decision_id(proxy, given, kept):
    p = await sim_proxy(proxy)
    status, headers, _ = await p.post("/v1/chat/completions",
                                      {"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
                                      headers={"x-request-id": given})
    headers = {k.lower(): v for k, v in headers.items()}
    assert status == 200
    assert (headers["x-request-id"] == given) is kept
    assert decision_of(headers).id == headers["x-request-id"]
    if not kept:
        assert len(headers["x-request-id"]) == 12


async def test_every_answer_has_an_access_log_line_with_id_bytes_and_error(proxy, upstreams):
    stream = io.StringIO()
    access = AccessLog(AccessLogConfig(), stream=stream)
    up = await upstreams({"/v1/chat/completions": ok_handler("x")})
    p = await proxy({"clients": {"keys_env": "KEYS"}, "providers": {"gpt": openai_provider(up.url)},
                     "routes": {"chat": {"targets": [{"provider": "gpt", "model": "m"}]}}},
                    env={"KEYS": "good"}, observers=[access])
    key = {"authorization": "Bearer good"}
    answers = [
        await p.post("/v1/chat/completions", {"model": "chat", "messages": []}, headers={"x-request-id": "bad-key"}),
        await p.post("/v1/chat/completions", {"model": "nope", "messages": []},
                     headers={**key, "x-request-id": "r404"}),
        await p.post("/v1/images/generations", {}, headers={**key, "x-request-id": "img"}),
        await p.post("/nowhere", {}, headers={"x-request-id": "nowhere"}),
        await p.post("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
                     headers={**key, "x-request-id": "ok"}),
    ]
    await p.stop()
    await access.close()  # the test made the access log, so it closes it (the gateway only feeds it)
    lines = [parse_text(line)[1] for line in stream.getvalue().splitlines()]
    assert [(a[0], {k.lower(): v for k, v in a[1].items()}["x-request-id"]) for a in answers] == [
        (401, "bad-key"), (404, "r404"), (404, "img"), (404, "nowhere"), (200, "ok")]
    by_id = {line["id"]: line for line in lines}
    assert by_id["bad-key"]["status"] == "401" and by_id["bad-key"]["error"] == "invalid_api_key"
    assert by_id["r404"]["route"] == "nope" and by_id["r404"]["error"] == "model_not_found"
    assert by_id["img"]["error"] == "unsupported_endpoint"
    assert by_id["nowhere"]["path"] == "/nowhere" and by_id["nowhere"]["status"] == "404"
    assert by_id["ok"]["route"] == "chat" and by_id["ok"]["served"] == "gpt"
    for rid, (_, _, body) in zip(["bad-key", "r404", "img", "nowhere", "ok"], answers, strict=True):
        assert by_id[rid]["bytes"] == str(len(body)), rid


async def test_json_access_log_has_the_id_and_route_asked_for(proxy):
    stream = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=stream)
    p = await sim_proxy(proxy, observers=[access])
    await p.post("/v1/chat/completions", {"model": "missing", "messages": []}, headers={"x-request-id": "j1"})
    await p.stop()
    await access.close()
    line = json.loads(stream.getvalue().splitlines()[-1])
    assert (line["id"], line["route"], line["status"], line["error"]) == ("j1", "missing", 404, "model_not_found")


async def test_a_messages_error_is_logged_with_the_size_the_client_got(proxy, upstreams):
    """/v1/messages errors go out in Anthropic's shape; the access log's bytes are of that body."""
    stream = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=stream)
    up = await upstreams({"/v1/chat/completions": status_handler(503)})
    p = await proxy(route_config([{"provider": "gpt", "model": "m"}], {"gpt": openai_provider(up.url)}),
                    observers=[access])
    messages = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    answers = [
        await p.post("/v1/messages", {**messages, "model": "nope"}, headers={"x-request-id": "unknown"}),
        await p.post("/v1/messages", {**messages, "model": "chat"}, headers={"x-request-id": "failed"}),
        await p.post("/v1/messages", {"model": "chat"}, headers={"x-request-id": "bad"}),
    ]
    await p.stop()
    await access.close()
    by_id = {line["id"]: line for line in map(json.loads, stream.getvalue().splitlines())}
    for rid, (status, _, body) in zip(["unknown", "failed", "bad"], answers, strict=True):
        assert status >= 400 and orjson.loads(body)["type"] == "error", body  # Anthropic's shape
        assert by_id[rid]["bytes"] == len(body), rid


async def test_a_request_a_shutdowns_grace_cuts_is_logged_503_draining(proxy, upstreams):
    """Not the client's leaving: firstbyte's drain ended it, and the log says so."""
    started = asyncio.Event()

    async def hangs(request: web.Request) -> web.Response:
        started.set()
        await asyncio.sleep(30)
        return web.json_response({})

    stream = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=stream)
    up = await upstreams({"/v1/chat/completions": hangs})
    p = await proxy(route_config([{"provider": "gpt", "model": "m"}], {"gpt": openai_provider(up.url)}),
                    observers=[access])
    post = asyncio.create_task(p.post("/v1/chat/completions", {"model": "chat", "messages": []},
                                      headers={"x-request-id": "cut"}))
    await asyncio.wait_for(started.wait(), 5)
    p.gateway.draining = True  # as `firstbyte serve` sets it on SIGTERM
    await p.stop()  # the runner's grace (1 s) runs out and the handler is cancelled
    post.cancel()
    await asyncio.gather(post, return_exceptions=True)
    await access.close()
    [line] = [json.loads(raw) for raw in stream.getvalue().splitlines()]
    assert (line["id"], line["status"], line["error"], line["route"]) == ("cut", 503, "draining", "chat")
