"""The first token commits, over real loopback HTTP (docs/adr/0007): error events inside a 200
fail over and never win, each mode has its own figure, a request no target can hold is a 400."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from .anthropic_fakes import OVERLOADED, anthropic_provider, messages_handler, text_events
from .conftest import chat_body, chunk_event, decision_of, ok_handler, openai_provider, route_config, sse

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
ROLE = sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
OVERLOAD_ENVELOPE = sse({"error": {"message": "The server is overloaded", "type": "server_error",
                                   "code": "overloaded"}})


def streamed(*pieces: bytes, pause: float = 0.0, first: float = 0.0) -> Any:
    """A 200 event stream of ``pieces`` (a pause before the first and between the others)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(first)
        for i, piece in enumerate(pieces):
            if i and pause:
                await asyncio.sleep(pause)
            await response.write(piece)
        await response.write_eof()
        return response

    return handle


async def two_targets(upstreams, proxy, a_handler, b_handler=None, strategy="ordered", path="/v1/chat/completions",
                      **route: Any):
    a = await upstreams({path: a_handler})
    b = await upstreams({"/v1/chat/completions": b_handler or ok_handler("from-b")})
    config = route_config([{"provider": "a", "model": "ma"}, {"provider": "b", "model": "mb"}],
                          {"a": openai_provider(a.url) if path != "/v1/messages" else anthropic_provider(a.url),
                           "b": openai_provider(b.url)}, strategy, **route)
    return a, b, await proxy(config)


async def sdk_stream(p: Any) -> tuple[Any, list[str]]:
    """A streamed chat through the openai SDK: the raw response (for headers) and its words."""
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(**CHAT, stream=True)
        words = [c.choices[0].delta.content async for c in raw.parse() if c.choices and c.choices[0].delta.content]
    finally:
        await client.close()
    return raw, words


def texts(body: bytes) -> list[Any]:
    out = []
    for block in body.split(b"\n\n"):
        if block.startswith(b"data: ") and block != b"data: [DONE]":
            out.append(orjson.loads(block[6:]))
    return out


async def test_a_200_whose_first_event_is_an_error_fails_over_and_the_client_sees_only_the_answer(
        upstreams, proxy):
    a, b, p = await two_targets(upstreams, proxy, streamed(ROLE, OVERLOAD_ENVELOPE))
    raw, words = await sdk_stream(p)
    assert "".join(words) == "from-b0from-b1from-b2"
    d = decision_of(dict(raw.headers))
    assert d.attempt_outcomes() == [("a", "error event overloaded"), ("b", "200")]
    assert d.served == "b"
    state = p.gateway.state
    assert state.health(("a", "ma"), p.gateway.clock()).failures == 1  # counted like a 503
    assert state.tracker.samples(("a", "ma"), "streamed") == 0  # and never a figure


async def test_a_target_that_fails_fast_with_error_events_never_leads_fastest(upstreams, proxy):
    a, b, p = await two_targets(upstreams, proxy, streamed(OVERLOAD_ENVELOPE),
                                streamed(chunk_event("slow but real"), chunk_event("", "stop"), b"data: [DONE]\n\n",
                                         first=0.05),
                                strategy="fastest", fastest={"explore": 0.2, "seed": 3})
    served = []
    for _ in range(40):
        status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert status == 200
        assert texts(body)[0]["choices"][0]["delta"]["content"] == "slow but real"
        served.append(decision_of(headers).served)
    assert served == ["b"] * 40
    assert p.gateway.state.figure(("a", "ma"), p.gateway.config.routes["chat"].fastest, p.gateway.clock()) is None
    # its breaker opened after cooldown.failures of them: its free measure, then two on the budget once the
    # cold start's advances were repaid (docs/adr/0023, amendment: forty requests, not twenty as before)
    assert len(a.calls) == 3


async def test_anthropic_error_after_message_start_fails_over_for_openai_clients(upstreams, proxy):
    events = [*text_events(["never"])[:1], OVERLOADED]  # message_start, then event: error
    a, b, p = await two_targets(upstreams, proxy, messages_handler(events=events), path="/v1/messages")
    raw, words = await sdk_stream(p)
    assert "".join(words) == "from-b0from-b1from-b2"
    assert decision_of(dict(raw.headers)).attempt_outcomes() == [("a", "error event overloaded_error"),
                                                                 ("b", "200")]


async def test_anthropic_error_after_message_start_fails_over_for_messages_clients(upstreams, proxy):
    events = [*text_events(["never"])[:2], OVERLOADED]  # message_start, content_block_start, event: error
    a, b, p = await two_targets(upstreams, proxy, messages_handler(events=events), path="/v1/messages")
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="k", max_retries=0)
    try:
        async with client.messages.stream(model="chat", max_tokens=50,
                                          messages=[{"role": "user", "content": "hi"}]) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
    finally:
        await client.close()
    assert text == "from-b0from-b1from-b2"
    assert final.stop_reason == "end_turn"
    assert len(a.calls) == 1 and len(b.calls) == 1


async def test_an_error_envelope_after_content_ends_the_stream_with_an_error_event(upstreams, proxy):
    a, b, p = await two_targets(upstreams, proxy, streamed(ROLE, chunk_event("partial"), OVERLOAD_ENVELOPE))
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    payloads = texts(body)
    assert status == 200
    assert payloads[1]["choices"][0]["delta"]["content"] == "partial"
    assert payloads[-1]["error"]["code"] == "stream_interrupted"
    assert "overloaded" in payloads[-1]["error"]["message"]
    assert b"[DONE]" not in body
    assert len(b.calls) == 0  # no failover after a token
    assert p.gateway.state.success_share(("a", "ma")) == 0.5  # committed, then a failure


@pytest.mark.parametrize("ending", [pytest.param(b"data: [DONE]\n\n", id="done"), pytest.param(b"", id="eof")])
async def test_a_stream_that_ends_before_any_content_fails_over(upstreams, proxy, ending):
    a, b, p = await two_targets(upstreams, proxy, streamed(ROLE, b": keep-alive\n\n", ending))
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200
    assert [c["choices"][0]["delta"].get("content") for c in texts(body)][:1] == ["from-b0"]
    assert decision_of(headers).attempt_outcomes() == [("a", "empty stream"), ("b", "200")]


async def test_the_held_role_chunk_leaves_with_the_first_content_in_one_write(upstreams, proxy):
    a, b, p = await two_targets(upstreams, proxy,
                                streamed(ROLE, chunk_event("late"), chunk_event("", "stop"), b"data: [DONE]\n\n",
                                         pause=0.3))
    async with aiohttp.ClientSession() as session:
        t0 = time.monotonic()
        async with session.post(p.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            headers_at = time.monotonic() - t0
            first = await resp.content.readany()
            rest = await resp.read()
    assert headers_at >= 0.3  # nothing, headers included, left before the first token
    assert first == ROLE + chunk_event("late")  # the role chunk and the first content, together
    assert rest.endswith(b"data: [DONE]\n\n")
    assert decision_of(dict(resp.headers)).attempts[0][1].startswith("200 0.3")  # figure: time to first token


async def test_an_invalid_request_error_event_goes_back_as_a_400(upstreams, proxy):
    bad = sse({"error": {"message": "temperature must be <= 2", "type": "invalid_request_error",
                         "param": "temperature", "code": None}})
    a, b, p = await two_targets(upstreams, proxy, streamed(ROLE, bad))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(**CHAT, stream=True)
    finally:
        await client.close()
    assert info.value.body["message"] == "temperature must be <= 2"
    assert decision_of(dict(info.value.response.headers)).attempt_outcomes() == [
        ("a", "error event invalid_request_error")]
    assert len(b.calls) == 0
    assert p.gateway.state.health(("a", "ma"), p.gateway.clock()).failures == 0  # the client's mistake


async def test_a_buffered_200_carrying_an_error_object_fails_over(upstreams, proxy):
    async def error_200(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Rate limit reached", "type": "rate_limit_error"}})

    a, b, p = await two_targets(upstreams, proxy, error_200)
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"] == "from-b"
    assert decision_of(headers).attempt_outcomes() == [("a", "error body rate_limit_error"), ("b", "200")]
    assert p.gateway.state.tracker.samples(("a", "ma"), "buffered") == 0


def timed(first: float, whole: float) -> Any:
    """First token at ``first`` seconds when streamed; the whole answer at ``whole`` when buffered."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            await asyncio.sleep(whole)
            return web.json_response(chat_body("whole"))
        return await streamed(chunk_event("tok"), chunk_event("", "stop"), b"data: [DONE]\n\n",
                              first=first, pause=whole - first)(request)

    return handle


@pytest.mark.parametrize(
    ("written", "measured", "asked", "leader"),
    [
        # quick: first token at 20 ms, whole answer 400 ms; steady: 200 ms and 250 ms.
        pytest.param(["quick", "steady"], False, True, "quick", id="streamed-after-only-buffered-traffic"),
        pytest.param(["steady", "quick"], True, False, "steady", id="buffered-after-only-streamed-traffic"),
    ],
)
async def test_each_mode_is_ranked_by_its_own_figures(upstreams, proxy, written, measured, asked, leader):
    ups = {"quick": await upstreams({"/v1/chat/completions": timed(0.02, 0.4)}),
           "steady": await upstreams({"/v1/chat/completions": timed(0.2, 0.25)})}
    config = route_config([{"provider": n, "model": "m"} for n in written],
                          {n: openai_provider(ups[n].url) for n in written}, "fastest", fastest={"explore": 0})
    p = await proxy(config)
    for _ in range(3):  # measures both targets in one mode; the third follows the figures
        _, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": measured})
    other = {True: "quick", False: "steady"}[measured]
    assert decision_of(headers).order[0] == (other, decision_of(headers).order[0][1])
    assert decision_of(headers).first_reason == "fastest"
    # The other mode has no figures: its order is not taken from this mode's clock.
    _, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": asked})
    d = decision_of(headers)
    assert (d.served, d.first_reason) == (leader, "unmeasured")
    _, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": asked})
    _, headers, _ = await p.post("/v1/chat/completions", {**CHAT, "stream": asked})
    d = decision_of(headers)
    assert (d.served, d.first_reason) == (leader, "fastest")  # and once measured, its own figure agrees
    status, health = await p.get("/v1/health")
    row = next(r for r in health["targets"] if r["target"] == "quick")
    assert row["streamed"]["figure_s"] < 0.15 < 0.3 < row["buffered"]["figure_s"]


async def test_a_request_too_large_for_every_target_is_a_400_with_no_upstream_call(upstreams, proxy):
    a = await upstreams({"/v1/chat/completions": ok_handler("a")})
    b = await upstreams({"/v1/chat/completions": ok_handler("b")})
    config = route_config([{"provider": "a", "model": "m", "context_window": 1000},
                           {"provider": "b", "model": "m", "context_window": 4000}],
                          {"a": openai_provider(a.url), "b": openai_provider(b.url)})
    p = await proxy(config)
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=2)
    try:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="chat", max_tokens=5000,
                                                 messages=[{"role": "user", "content": "hi"}])
        assert info.value.body["code"] == "context_length_exceeded"
        d = decision_of(dict(info.value.response.headers))
        assert d.excluded == (("a", "context 1000 < 5000"), ("b", "context 4000 < 5000"))
        assert len(a.calls) == len(b.calls) == 0  # and the SDK did not retry it
        answer = await client.chat.completions.with_raw_response.create(
            model="chat", max_tokens=2000, messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    d = decision_of(dict(answer.headers))
    assert d.served == "b" and d.excluded == (("a", "context 1000 < 2000"),)


async def test_a_floor_no_target_meets_is_a_400_naming_the_floor(upstreams, proxy):
    a = await upstreams({"/v1/chat/completions": ok_handler("a")})
    config = route_config([{"provider": "a", "model": "m", "quality": 0.4}], {"a": openai_provider(a.url)},
                          min_quality=0.7)
    p = await proxy(config)
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 400 and orjson.loads(body)["error"]["code"] == "min_quality"
    assert decision_of(headers).excluded == (("a", "quality 0.4 below min 0.7"),)


async def test_a_route_emptied_by_missing_credentials_stays_503(upstreams, proxy):
    a = await upstreams({"/v1/chat/completions": ok_handler("a")})
    config = route_config([{"provider": "a", "model": "m", "context_window": 1000}],
                          {"a": openai_provider(a.url, api_key_env="NOT_SET_ANYWHERE")})
    p = await proxy(config)
    status, headers, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 503 and orjson.loads(body)["error"]["code"] == "no_eligible_target"


async def test_anthropic_error_after_an_empty_thinking_block_start_fails_over(upstreams, proxy):
    """With extended thinking every Anthropic stream opens a thinking block: message_start, then
    content_block_start of {"type": "thinking", "thinking": ""}. That start carries no token (ADR
    0007 lists only tool_use and non-empty text block starts as committing), so an overloaded_error
    after it must fail over like one after an empty text block's start."""
    from .anthropic_fakes import OVERLOADED, event, messages_handler, text_events

    start = text_events(["never"])[0]
    thinking = event("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": ""}})
    a, b, p = await two_targets(upstreams, proxy, messages_handler(events=[start, thinking, OVERLOADED]),
                                path="/v1/messages")
    raw, words = await sdk_stream(p)
    assert "".join(words) == "from-b0from-b1from-b2"
    assert decision_of(dict(raw.headers)).attempt_outcomes() == [("a", "error event overloaded_error"),
                                                                 ("b", "200")]


async def test_a_finish_reason_error_before_any_content_fails_over(upstreams, proxy):
    """OpenRouter ends a failed generation with finish_reason "error". Before any content that is
    no answer (an empty answer that *finishes* is one; an error is not): it must fail over, not be
    committed and relayed as an empty success that feeds the figure."""
    from .conftest import sse

    error_finish = sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up",
                        "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]})
    a, b, p = await two_targets(upstreams, proxy, streamed(ROLE, error_finish, b"data: [DONE]\n\n"))
    status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and b"from-b0" in body, headers.get("x-route-decision")
    assert decision_of(headers).served == "b"
