"""The gateway end to end: real firstbyte, real fake upstreams, real clients."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from ..conftest import (
    chat_body,
    chunk_event,
    decision_of,
    ok_handler,
    openai_provider,
    route_config,
    status_handler,
)

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


_clients: list[openai.AsyncOpenAI] = []


def client(proxy_url: str, **kwargs: Any) -> openai.AsyncOpenAI:
    c = openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key="client-secret", max_retries=0, **kwargs)
    _clients.append(c)
    return c


@pytest.fixture(autouse=True)
async def _close_clients():
    yield
    while _clients:
        await _clients.pop().close()


async def settled(p, key: tuple[str, str]) -> None:
    """Wait (bounded) for the gateway to release the call it was making to ``key``."""
    for _ in range(50):
        if p.gateway.state.target(key).in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert p.gateway.state.target(key).in_flight == 0


async def two_targets(upstreams, proxy, first_handler, second_handler=None, **extra):
    a = await upstreams({"/v1/chat/completions": first_handler})
    b = await upstreams({"/v1/chat/completions": second_handler or ok_handler("from-b")})
    targets = [{"provider": "a", "model": "model-a", **extra.pop("a_target", {})},
               {"provider": "b", "model": "model-b"}]
    providers = {"a": openai_provider(a.url, **extra.pop("a_provider", {})), "b": openai_provider(b.url)}
    p = await proxy(route_config(targets, providers, **extra))
    return a, b, p


async def test_buffered_chat_through_openai_sdk(upstreams, proxy):
    up = await upstreams({"/v1/chat/completions": ok_handler("hello")})
    p = await proxy(
        route_config([{"provider": "up", "model": "gpt-upstream"}],
                     {"up": openai_provider(up.url, api_key_env="UP_KEY")}),
        env={"UP_KEY": "provider-secret"},
    )
    raw = await client(p.url).chat.completions.with_raw_response.create(**CHAT)
    completion = raw.parse()
    assert completion.choices[0].message.content == "hello"
    decision = decision_of(dict(raw.headers))
    assert (decision.route, decision.strategy, decision.served) == ("chat", "ordered", "up")
    assert decision.order == (("up", "written"),)
    assert decision.attempt_outcomes() == [("up", "200")]
    sent = up.calls[0]
    assert sent["json"]["model"] == "gpt-upstream"
    assert sent["headers"]["Authorization"] == "Bearer provider-secret"
    assert "client-secret" not in orjson.dumps(sent["headers"]).decode()


async def test_streamed_chat_through_openai_sdk(upstreams, proxy):
    up = await upstreams({"/v1/chat/completions": ok_handler("w", chunks=4)})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    stream = await client(p.url).chat.completions.create(**CHAT, stream=True)
    texts = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert texts == ["w0", "w1", "w2", "w3"]


async def test_upstream_credential_and_hop_headers_never_come_back(upstreams, proxy):
    async def leaky(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            chat_body(),
            headers={"set-cookie": "session=secret", "x-api-key": "k", "www-authenticate": "Bearer",
                     "keep-alive": "timeout=5", "anthropic-ratelimit-requests-remaining": "7"},
        )

    up = await upstreams({"/v1/chat/completions": leaky})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    status, headers, _ = await p.post("/v1/chat/completions", CHAT, {"authorization": "Bearer client-secret"})
    assert status == 200
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in ("set-cookie", "x-api-key", "www-authenticate", "keep-alive"):
        assert name not in lowered
    assert lowered["anthropic-ratelimit-requests-remaining"] == "7"
    assert "authorization" not in {k.lower() for k in up.calls[0]["headers"]}


@pytest.mark.parametrize(
    ("first", "outcome"),
    [
        pytest.param(status_handler(503), "503", id="503-fails-over"),
        pytest.param(status_handler(500), "500", id="500-fails-over"),
        pytest.param(status_handler(408), "408", id="408-fails-over"),
        pytest.param(status_handler(429, headers={"retry-after": "7"}), "429", id="429-retry-after-fails-over"),
        pytest.param(
            status_handler(400, "This model's maximum context length is 8192 tokens"),
            "400 context overflow",
            id="context-overflow-fails-over",
        ),
    ],
)
async def test_failover_safe_statuses_move_on(upstreams, proxy, first, outcome):
    _a, _b, p = await two_targets(upstreams, proxy, first)
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 200, body
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "from-b"
    d = decision_of(headers)
    assert d.attempt_outcomes() == [("a", outcome), ("b", "200")]
    assert d.served == "b"


async def test_retry_after_cools_the_target_down(upstreams, proxy):
    a, _b, p = await two_targets(upstreams, proxy, status_handler(429, headers={"retry-after": "7"}))
    await p.post("/v1/chat/completions", CHAT)
    _status, headers, _ = await p.post("/v1/chat/completions", CHAT)
    d = decision_of(headers)
    assert d.excluded_reason("a") == "cooling down 7s"
    assert d.attempt_names == ["b"]
    assert len(a.calls) == 1


async def test_422_is_returned_unchanged_without_failover(upstreams, proxy):
    _a, b, p = await two_targets(upstreams, proxy, status_handler(422, "messages[0].role: bad role"))
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 422
    assert orjson.loads(body)["error"]["message"] == "messages[0].role: bad role"
    assert decision_of(headers).attempt_outcomes() == [("a", "422")]
    assert b.calls == []


async def test_connection_reset_before_headers_fails_over(raw_upstreams, upstreams, proxy):
    async def reset(reader, writer):
        writer.transport.abort()

    bad = await raw_upstreams(reset)
    good = await upstreams({"/v1/chat/completions": ok_handler("ok")})
    p = await proxy(route_config(
        [{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
        {"bad": openai_provider(bad.url), "good": openai_provider(good.url)},
    ))
    status, headers, _ = await p.post("/v1/chat/completions", CHAT)
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("bad", "reset"), ("good", "200")]


async def test_refused_connection_fails_over(upstreams, proxy):
    # a port bound and never listening refuses every connect, and no server the test starts can take it
    # (a port found free and let go could be the upstream's or the proxy's by the time it is dialled)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        good = await upstreams({"/v1/chat/completions": ok_handler("ok")})
        p = await proxy(route_config(
            [{"provider": "gone", "model": "m"}, {"provider": "good", "model": "m"}],
            {"gone": {"kind": "openai", "base_url": f"http://127.0.0.1:{held.getsockname()[1]}/v1"},
             "good": openai_provider(good.url)},
        ))
        status, headers, _ = await p.post("/v1/chat/completions", CHAT)
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("gone", "refused"), ("good", "200")]


async def test_hang_past_first_chunk_times_out_and_fails_over(upstreams, proxy):
    async def hang(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    _a, _b, p = await two_targets(upstreams, proxy, hang, a_provider={"timeouts": {"first_chunk": 0.3}})
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("a", "timeout"), ("b", "200")]


async def test_buffered_body_that_stalls_past_total_times_out_and_fails_over(upstreams, proxy):
    """The first chunk of a buffered answer came in time; the rest never does. The sweeper's total
    deadline cuts it (it is failover-safe: nothing reached the client) and the walk moves on."""

    async def half_body(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"id": "half", "choices": [')
        await asyncio.sleep(30)
        return response

    _a, _b, p = await two_targets(upstreams, proxy, half_body,
                                  a_provider={"timeouts": {"first_chunk": 5, "total": 0.4}})
    started = asyncio.get_running_loop().time()
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 200 and b"from-b" in body
    assert decision_of(headers).attempt_outcomes() == [("a", "timeout"), ("b", "200")]
    assert asyncio.get_running_loop().time() - started < 3  # the total deadline, not first_chunk's 5 s


async def test_streamed_first_chunk_that_never_comes_times_out(upstreams, proxy):
    async def headers_only(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(30)
        return response

    _a, _b, p = await two_targets(upstreams, proxy, headers_only, a_provider={"timeouts": {"first_chunk": 0.3}})
    status, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("a", "timeout"), ("b", "200")]


async def test_retries_on_one_target_before_moving_on(upstreams, proxy):
    answers = iter([status_handler(502), ok_handler("second try")])

    async def flaky(request: web.Request) -> web.StreamResponse:
        return await next(answers)(request)

    _a, b, p = await two_targets(upstreams, proxy, flaky, a_target={"retry": 1})
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 200
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "second try"
    assert decision_of(headers).attempt_outcomes() == [("a", "502"), ("a", "200")]
    assert b.calls == []


async def test_all_failed_returns_the_last_error_in_openai_shape(upstreams, proxy):
    _a, _b, p = await two_targets(upstreams, proxy, status_handler(503, "a down"), status_handler(500, "b broke"))
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 500
    err = orjson.loads(body)["error"]
    assert err["message"] == "b broke"
    assert set(err) == {"message", "type", "param", "code"}
    d = decision_of(headers)
    assert d.attempt_outcomes() == [("a", "503"), ("b", "500")]
    assert d.served is None


async def test_all_transport_failures_give_502_and_timeouts_504(raw_upstreams, upstreams, proxy):
    async def reset(reader, writer):
        writer.transport.abort()

    bad = await raw_upstreams(reset)
    p = await proxy(route_config([{"provider": "bad", "model": "m"}], {"bad": openai_provider(bad.url)}))
    status, _, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 502
    assert orjson.loads(body)["error"]["type"] == "upstream_error"

    async def hang(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    slow = await upstreams({"/v1/chat/completions": hang})
    p2 = await proxy(route_config([{"provider": "slow", "model": "m"}],
                                  {"slow": openai_provider(slow.url, timeouts={"first_chunk": 0.2})}))
    status, headers, body = await p2.post("/v1/chat/completions", CHAT)
    assert status == 504
    assert orjson.loads(body)["error"]["type"] == "timeout_error"
    assert decision_of(headers).attempt_outcomes() == [("slow", "timeout")]


async def test_nothing_eligible_is_503_with_the_decision(upstreams, proxy):
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    p = await proxy(route_config(
        [{"provider": "keyed", "model": "m"}, {"provider": "other", "model": "m"}],
        {"keyed": openai_provider(up.url, api_key_env="MISSING_KEY"),
         "other": openai_provider(up.url, api_key_env="ALSO_MISSING")},
    ))
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 503
    d = decision_of(headers)
    assert d.excluded == (("keyed", "no credentials"), ("other", "no credentials"))
    assert d.order == ()
    assert "no credentials" in orjson.loads(body)["error"]["message"]
    assert up.calls == []


async def test_stream_is_relayed_chunk_by_chunk(upstreams, proxy):
    """The upstream holds chunk 2 until the client has received chunk 1."""
    client_got_first = asyncio.Event()

    async def gated(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("one"))
        await asyncio.wait_for(client_got_first.wait(), 5)
        await response.write(chunk_event("two"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    up = await upstreams({"/v1/chat/completions": gated})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    stream = await client(p.url).chat.completions.create(**CHAT, stream=True)
    texts = []
    async for chunk in stream:
        texts.append(chunk.choices[0].delta.content)
        client_got_first.set()
    assert texts == ["one", "two"]


async def test_client_disconnect_cancels_the_upstream_call(upstreams, proxy):
    upstream_gone = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(chunk_event("x"))
                await asyncio.sleep(0.02)
        except (asyncio.CancelledError, ConnectionError):
            upstream_gone.set()
            raise

    up = await upstreams({"/v1/chat/completions": endless})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    async with aiohttp.ClientSession() as session:
        resp = await session.post(p.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        assert await resp.content.readany()
        resp.close()  # the client goes away mid-stream
    await asyncio.wait_for(upstream_gone.wait(), 5)
    await settled(p, ("up", "m"))


async def test_failure_after_commit_ends_the_stream_with_an_error_event(raw_upstreams, proxy):
    async def cut(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        event = chunk_event("partial")
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    up = await raw_upstreams(cut)
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    status, _headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200
    events = [e for e in body.split(b"\n\n") if e]
    assert b"partial" in events[0]
    error = orjson.loads(events[-1].removeprefix(b"data: "))["error"]
    assert error["code"] == "stream_interrupted"
    assert p.gateway.state.target(("up", "m")).breaker.failures == 1


async def test_openai_sdk_raises_on_an_interrupted_stream(raw_upstreams, proxy):
    async def cut(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        event = chunk_event("partial")
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        writer.transport.abort()

    up = await raw_upstreams(cut)
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    stream = await client(p.url).chat.completions.create(**CHAT, stream=True)
    with pytest.raises(openai.APIError, match="incomplete"):
        async for _ in stream:
            pass


async def test_fastest_converges_to_the_faster_upstream(upstreams, proxy):
    def delayed(seconds: float, text: str):
        async def handle(request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(seconds)
            return await ok_handler(text)(request)

        return handle

    slow = await upstreams({"/v1/chat/completions": delayed(0.3, "slow")})  # far apart: a loaded CI box
    fast = await upstreams({"/v1/chat/completions": delayed(0.01, "fast")})
    p = await proxy(route_config(
        [{"provider": "slow", "model": "m"}, {"provider": "fast", "model": "m"}],
        {"slow": openai_provider(slow.url), "fast": openai_provider(fast.url)},
        strategy="fastest", fastest={"explore": 0, "seed": 1}, hedge=False,
    ))
    served = []
    reasons = []
    for _ in range(6):
        _, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
        d = decision_of(headers)
        served.append(d.served)
        reasons.append(d.first_reason)
    # Both unmeasured targets are measured first, in written order; then the fast one leads.
    assert served[:2] == ["slow", "fast"]
    assert reasons[:2] == ["unmeasured", "unmeasured"]
    assert served[2:] == ["fast"] * 4
    assert reasons[2:] == ["fastest"] * 4


async def test_a_fastest_route_saying_nothing_about_hedge_races_from_its_first_request(upstreams, proxy):
    async def slow_handle(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.3)
        return await ok_handler("slow")(request)

    slow = await upstreams({"/v1/chat/completions": slow_handle})
    fast = await upstreams({"/v1/chat/completions": ok_handler("fast")})
    p = await proxy(route_config(
        [{"provider": "slow", "model": "m"}, {"provider": "fast", "model": "m"}],
        {"slow": openai_provider(slow.url), "fast": openai_provider(fast.url)},
        strategy="fastest", fastest={"explore": 0, "seed": 1},
    ))
    _, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    d = decision_of(headers)
    # Unraced, the written-first slow target would serve the first request alone (the test above);
    # by default the unmeasured fast one races it and wins.
    assert d.served == "fast"
    assert {name for name, _ in d.race} == {"slow", "fast"}


async def test_unknown_route_is_404_model_not_found(proxy):
    p = await proxy(route_config([{"provider": "s", "model": "m"}], {"s": {"kind": "simulated"}}))
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "model": "nope"})
    assert status == 404
    err = orjson.loads(body)["error"]
    assert err["code"] == "model_not_found"
    assert "chat" in err["message"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(b"{not json", 400, "invalid_json", id="bad-json"),
        pytest.param(b"[1, 2]", 400, "invalid_json", id="not-an-object"),
        pytest.param(b"", 400, "invalid_json", id="empty"),
        pytest.param(orjson.dumps({"messages": []}), 400, "missing_model", id="missing-model"),
        pytest.param(orjson.dumps({"model": 7, "messages": []}), 400, "invalid_model", id="model-not-a-string"),
        pytest.param(b'{"model": "chat", "x": "' + b"a" * 5000 + b'"}', 413, "request_too_large", id="too-large"),
    ],
)
async def test_bad_requests_get_clear_openai_errors(proxy, body, status, code):
    config = route_config([{"provider": "s", "model": "m"}], {"s": {"kind": "simulated"}})
    config["max_body_bytes"] = 4096
    p = await proxy(config)
    got, _, raw = await p.post("/v1/chat/completions", body)
    assert got == status
    err = orjson.loads(raw)["error"]
    assert err["code"] == code
    assert err["message"]
    if code == "invalid_model":
        assert "'model' must be a string" in err["message"] and err["param"] == "model"
    if code == "request_too_large":  # the Content-Length it declared, and the limit
        assert err["message"] == f"Request body is {len(body)} bytes; this gateway accepts at most 4096 bytes " \
                                 "(max_body_bytes)."


async def test_simulated_pool_serves_all_operations(proxy):
    sim = {"kind": "simulated", "simulate": {"first_chunk_ms": 5, "jitter_ms": 0, "chunk_ms": 1, "chunks": 3}}
    p = await proxy(route_config([{"provider": "s", "model": "sim-1"}], {"s": sim}))
    c = client(p.url)
    completion = await c.chat.completions.create(**CHAT)
    assert completion.choices[0].message.content == "tok0 tok1 tok2 "
    text = await c.completions.create(model="chat", prompt="once upon")
    assert text.choices[0].text == "tok0 tok1 tok2 "
    stream = await c.completions.create(model="chat", prompt="once upon", stream=True)
    assert [ch.choices[0].text async for ch in stream if ch.choices] == ["tok0 ", "tok1 ", "tok2 ", ""]
    emb = await c.embeddings.create(model="chat", input=["a", "b"])
    assert [len(e.embedding) for e in emb.data] == [8, 8]


async def test_models_health_and_readiness(proxy):
    p = await proxy(route_config([{"provider": "s", "model": "m"}], {"s": {"kind": "simulated"}}))
    models = await client(p.url).models.list()
    assert [m.id for m in models.data] == ["chat"]
    assert await p.get("/healthz") == (200, {"status": "alive"})
    status, body = await p.get("/readyz")
    assert status == 200 and body["status"] == "ready"
    p.gateway.draining = True
    assert (await p.get("/readyz"))[0] == 503


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/v1/nope", 404, id="unknown-path"),
        pytest.param("GET", "/v1/chat/completions", 405, id="wrong-method"),
    ],
)
async def test_aiohttp_refusals_take_the_openai_shape(proxy, method, path, status):
    p = await proxy(route_config([{"provider": "s", "model": "m"}], {"s": {"kind": "simulated"}}))
    async with aiohttp.ClientSession() as session, session.request(method, p.url + path) as resp:
        assert resp.status == status
        err = (await resp.json())["error"]
        assert err["code"] == f"http_{status}"
        assert path in err["message"]
        assert resp.headers.get("Allow") == ("POST" if status == 405 else None)


async def test_client_leaving_before_the_first_chunk_cancels_the_upstream_call(upstreams, proxy):
    upstream_gone = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            upstream_gone.set()
            raise
        raise AssertionError("unreachable")

    up = await upstreams({"/v1/chat/completions": hang})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(session.post(p.url + "/v1/chat/completions", json={**CHAT, "stream": True}), 0.3)
    await asyncio.wait_for(upstream_gone.wait(), 5)
    await settled(p, ("up", "m"))
    assert p.gateway.state.target(("up", "m")).breaker.failures == 0  # the client left; the provider did nothing
