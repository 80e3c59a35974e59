"""Upstream answers of very many JSON objects and arrays (bounds.MAX_EVENT_CONTAINERS, MAX_ANSWER_CONTAINERS).

A harden review's (2026-12-06): 15 MB of ``[],`` (5M empty arrays) as an upstream's answer held firstbyte's event
loop while orjson built them: 0.52 s per streamed event (chat passthrough), 0.74 s on /v1/messages streamed, 0.52 s
buffered. Requests were bounded (400 ``too_many_containers``), answers were not. Now they are counted from their
bytes before anything parses them, and one past the cap is treated as an answer nested too deep is: an ``invalid
body`` that fails over before the first token (here), the stream's error event after it (tests/test_relay.py's
table). Real fake upstreams on loopback; the SDKs read what the client gets.
"""

from __future__ import annotations

import anthropic
import openai
import orjson
from aiohttp import web

from proxy.bounds import MAX_ANSWER_CONTAINERS, MAX_EVENT_CONTAINERS

from .conftest import (
    chat_answered,
    chat_body,
    chat_refused,
    chunk_event,
    decision_of,
    ok_handler,
    openai_provider,
    route_config,
    streaming,
)

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
ASK = {"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def wide_answer(containers: int) -> bytes:
    """A chat answer of exactly ``containers`` objects and arrays: its own, then empty arrays under ``x``."""
    answer = orjson.dumps({**chat_body("wide"), "x": None})
    own = answer.count(b"[") + answer.count(b"{") + 1  # and x's list
    return answer.replace(b'"x":null', b'"x":[' + b",".join([b"[]"] * (containers - own)) + b"]")


def wide_first_event(containers: int) -> bytes:
    """A first chunk that carries content, of exactly ``containers`` objects and arrays."""
    event = chunk_event("from-bad")
    own = event.count(b"[") + event.count(b"{") + 1
    return event[:-3] + b',"x":[' + b",".join([b"[]"] * (containers - own)) + b"]}\n\n"


def answering(body: bytes):  # type: ignore[no-untyped-def]
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    return handle


async def bad_then_good(upstreams, proxy, bad_handler):  # type: ignore[no-untyped-def]
    bad = await upstreams({"*": bad_handler})
    good = await upstreams({"/v1/chat/completions": ok_handler("fine")})
    return await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                    {"bad": openai_provider(bad.url), "good": openai_provider(good.url)}))


def failed_over(p, headers) -> None:  # type: ignore[no-untyped-def]
    assert decision_of(dict(headers)).attempt_outcomes()[0][0] == "bad", headers
    outcomes = decision_of(dict(headers)).attempt_outcomes()
    assert outcomes[0][1] in ("invalid body", "malformed stream") and outcomes[-1] == ("good", "200"), outcomes
    assert p.gateway.state.target(("bad", "m")).breaker.health(p.gateway.clock()).failures == 1


async def test_a_buffered_answer_of_too_many_containers_fails_over_on_chat(upstreams, proxy):
    p = await bad_then_good(upstreams, proxy, answering(wide_answer(MAX_ANSWER_CONTAINERS + 1)))
    content, headers = await chat_answered(p)
    assert content == "fine"
    failed_over(p, headers)


async def test_a_buffered_answer_of_too_many_containers_fails_over_on_messages(upstreams, proxy):
    """/v1/messages parses the chat answer to translate it: 0.52 s for the review's 5M arrays."""
    p = await bad_then_good(upstreams, proxy, answering(wide_answer(MAX_ANSWER_CONTAINERS + 1)))
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="k", max_retries=0)
    try:
        raw = await client.messages.with_raw_response.create(**ASK)
        assert (await raw.parse()).content[0].text == "fine"  # type: ignore[union-attr]
    finally:
        await client.close()
    failed_over(p, raw.headers)


async def test_a_lone_target_of_too_many_containers_is_a_502_that_says_so(upstreams, proxy):
    bad = await upstreams({"*": answering(wide_answer(MAX_ANSWER_CONTAINERS + 1))})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}], {"bad": openai_provider(bad.url)}))
    refused = await chat_refused(p)
    assert refused.status_code == 502
    said = refused.message
    assert f"{MAX_ANSWER_CONTAINERS + 1:,} JSON objects and arrays" in said and f"{MAX_ANSWER_CONTAINERS:,}" in said


async def test_a_buffered_answer_at_the_cap_is_relayed(upstreams, proxy):
    answer = wide_answer(MAX_ANSWER_CONTAINERS)
    up = await upstreams({"*": answering(answer)})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    status, _, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 200 and body == answer


GOOD_STREAM = (chunk_event("from-good"), chunk_event("", "stop"), b"data: [DONE]\n\n")


async def test_a_first_event_of_too_many_containers_fails_over_on_chat(upstreams, proxy):
    """Before the first token nothing reached the client: the next target answers (the openai SDK reads it)."""
    bad = await upstreams({"*": streaming(wide_first_event(MAX_EVENT_CONTAINERS + 1), b"data: [DONE]\n\n")})
    good = await upstreams({"*": streaming(*GOOD_STREAM)})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                 {"bad": openai_provider(bad.url), "good": openai_provider(good.url)}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(**CHAT, stream=True)
        words = [chunk.choices[0].delta.content async for chunk in raw.parse() if chunk.choices]
    finally:
        await client.close()
    assert "".join(w or "" for w in words) == "from-good"
    failed_over(p, raw.headers)


async def test_a_first_event_of_too_many_containers_fails_over_on_messages(upstreams, proxy):
    bad = await upstreams({"*": streaming(wide_first_event(MAX_EVENT_CONTAINERS + 1), b"data: [DONE]\n\n")})
    good = await upstreams({"*": streaming(*GOOD_STREAM)})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                 {"bad": openai_provider(bad.url), "good": openai_provider(good.url)}))
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="k", max_retries=0)
    try:
        async with client.messages.stream(**ASK) as stream:  # type: ignore[arg-type]
            text = "".join([piece async for piece in stream.text_stream])
    finally:
        await client.close()
    assert text == "from-good"
    assert p.gateway.state.target(("bad", "m")).breaker.health(p.gateway.clock()).failures == 1


async def test_a_first_event_at_the_cap_commits(upstreams, proxy):
    first = wide_first_event(MAX_EVENT_CONTAINERS)
    up = await upstreams({"*": streaming(first, chunk_event("", "stop"), b"data: [DONE]\n\n")})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and body.startswith(first), body[:200]
