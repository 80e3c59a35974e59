"""A stream ends for the client at the upstream's end marker; the upstream's own end is read after.

Each upstream here sends its whole answer, ``[DONE]`` included, and then holds
its end of body back until the test says so. The client must have its whole
answer before that, and the call must still be settled properly afterwards:
the connection pooled when the upstream ends, closed when it stalls or keeps
talking past a limit, and never counted against the target. (What arrives in
the same read as the end marker still goes out with it: the client's stream
ends on a read boundary.)
"""

from __future__ import annotations

import asyncio
import io

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from proxy.config import AccessLog as AccessLogConfig
from proxy.observe.accesslog import AccessLog
from proxy.upstream.http1 import QUIET

from .anthropic_fakes import text_events
from .conftest import chunk_event, openai_provider, route_config, sse

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
KEY = ("up", "m")


def answer_then(after_done):  # type: ignore[no-untyped-def]
    """An upstream that streams a whole answer, then runs ``after_done`` before its end of body;
    it records each request's client port (one port per upstream connection)."""
    ports: list[int] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        ports.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("one") + chunk_event("", "stop"))
        await response.write(sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                  "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}))
        await response.write(b"data: [DONE]\n\n")
        await after_done(response)
        await response.write_eof()
        return response

    return handle, ports


async def read_whole(url: str) -> bytes:
    """The client's whole body; a proxy that waits for the upstream's end never gets here."""
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200
        return await asyncio.wait_for(resp.read(), 5)


async def released(p) -> None:
    """Wait (bounded) until the gateway has let go of the upstream call."""
    for _ in range(100):
        if p.gateway.state.target(KEY).in_flight == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the upstream call was never released")


def blameless(p) -> None:
    ts = p.gateway.state.target(KEY)
    assert ts.breaker.failures == 0
    assert False not in ts.history


async def test_the_client_has_its_answer_before_the_upstream_ends_and_the_connection_is_reused(
        upstreams, proxy):
    upstream_may_end = asyncio.Event()

    async def wait_for_test(response: web.StreamResponse) -> None:
        await asyncio.wait_for(upstream_may_end.wait(), 10)

    handle, ports = answer_then(wait_for_test)
    up = await upstreams({"/v1/chat/completions": handle})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))

    body = await read_whole(p.url)
    assert body.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' not in body  # the usage chunk firstbyte asked for is still dropped
    # The upstream has not ended yet: the call still holds its slot until it does.
    assert p.gateway.state.target(KEY).in_flight == 1
    upstream_may_end.set()
    await released(p)
    await asyncio.sleep(QUIET)  # a released connection is reused once it has been quiet (docs/adr/0015)

    assert (await read_whole(p.url)).endswith(b"data: [DONE]\n\n")
    await released(p)
    assert len(ports) == 2 and ports[0] == ports[1], "the drained connection went back to the pool"
    blameless(p)


async def test_an_upstream_that_stalls_after_its_end_marker_is_cut_by_the_idle_deadline(upstreams, proxy):
    upstream_cut = asyncio.Event()

    async def stall(response: web.StreamResponse) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            upstream_cut.set()

    handle, _ports = answer_then(stall)
    up = await upstreams({"/v1/chat/completions": handle})
    provider = openai_provider(up.url, timeouts={"idle": 0.3})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": provider}))

    assert (await read_whole(p.url)).endswith(b"data: [DONE]\n\n")
    await asyncio.wait_for(upstream_cut.wait(), 5)  # firstbyte dropped the connection
    await released(p)
    blameless(p)


async def test_an_upstream_that_talks_on_after_its_end_marker_loses_its_connection(upstreams, proxy):
    client_done = asyncio.Event()

    async def talk_on(response: web.StreamResponse) -> None:
        await asyncio.wait_for(client_done.wait(), 10)
        client_done.clear()
        for _ in range(20):  # 160 KB: more than firstbyte reads after an end marker
            await response.write(b": junk " + b"x" * 8192 + b"\n\n")

    handle, ports = answer_then(talk_on)
    up = await upstreams({"/v1/chat/completions": handle})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))

    for _ in range(2):
        body = await read_whole(p.url)
        assert body.endswith(b"data: [DONE]\n\n") and b"junk" not in body
        client_done.set()
        await released(p)
    assert len(ports) == 2 and ports[0] != ports[1], "a connection that kept talking is not reused"
    blameless(p)


def ends_without_done(finish: str | None):  # type: ignore[no-untyped-def]
    """An upstream whose stream ends cleanly (chunked end of body) without ``data: [DONE]``: after a
    chunk finishing with ``finish``, or (None) in the middle of its answer."""
    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("one") + chunk_event(" two"))
        if finish is not None:
            await response.write(chunk_event("", finish))
        await response.write_eof()
        return response

    return handle


async def test_a_stream_that_ends_without_done_or_a_finish_reason_is_a_cut_told_logged_and_counted(
        upstreams, proxy):
    """A reviewer's stream: content, then a clean end of body with neither ``[DONE]`` nor a
    finish_reason. It looked complete (no error event, nothing logged); it is a truncated answer."""
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    up = await upstreams({"/v1/chat/completions": ends_without_done(None)})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                    observers=[access])
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    words = []
    try:
        with pytest.raises(openai.APIError) as caught:
            async for chunk in await client.chat.completions.create(**CHAT):
                words.append(chunk.choices[0].delta.content)
    finally:
        await client.close()
    await access.close()
    assert words == ["one", " two"]
    assert "ended before its end marker" in caught.value.message and "incomplete" in caught.value.message
    assert orjson.loads(lines.getvalue())["error"] == "the upstream stream ended before its end marker"
    assert p.gateway.state.target(KEY).breaker.failures == 1


@pytest.mark.parametrize("finish", [pytest.param("stop", id="stop"), pytest.param("length", id="length")])
async def test_a_stream_that_ends_without_done_after_its_finish_reason_is_whole(upstreams, proxy, finish):
    """Some OpenAI-compatible servers end their streams so (TGI before 2.2, mistral.rs, llama-box):
    the answer said it was finished, so it is complete, as firstbyte's translators already read it."""
    up = await upstreams({"/v1/chat/completions": ends_without_done(finish)})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        chunks = [c async for c in await client.chat.completions.create(**CHAT)]
    finally:
        await client.close()
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, finish]
    await released(p)
    blameless(p)


async def test_a_close_delimited_stream_cut_mid_answer_is_told_as_a_cut(raw_upstreams, proxy):
    """The same cut, the body delimited by the connection's close (no chunked encoding, no length)."""
    async def script(reader, writer) -> None:  # type: ignore[no-untyped-def]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
                     + chunk_event("one") + chunk_event(" two"))
        await writer.drain()

    up = await raw_upstreams(script)
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    async with aiohttp.ClientSession() as session, session.post(p.url + "/v1/chat/completions", json=CHAT) as resp:
        body = await resp.read()
    last = orjson.loads(body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1].removeprefix(b"data: "))
    assert last["error"]["code"] == "stream_interrupted", body
    assert p.gateway.state.target(KEY).breaker.failures == 1


def _framed_by_lone_crs(events: list[bytes]):  # type: ignore[no-untyped-def]
    """An upstream whose every line ends with a lone CR (the SSE spec's "CRLF, LF or CR"), an event a
    read: its end marker's blank line is the body's last byte."""
    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event.replace(b"\n", b"\r"))
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    return handle


_LONE_CR_ENDS = [
    pytest.param("/v1/chat/completions", CHAT, "openai",
                 [chunk_event("one"), chunk_event(" two"), b"data: [DONE]\n\n"], id="chat-done"),
    pytest.param("/v1/messages", {**CHAT, "max_tokens": 20}, "anthropic",
                 text_events(["one", " two"]), id="messages-message-stop"),
    pytest.param("/v1/messages", {**CHAT, "max_tokens": 20}, "openai",
                 [chunk_event("one"), chunk_event(" two"), b"data: [DONE]\n\n"], id="messages-from-chat-done"),
    pytest.param("/v1/responses", {"model": "chat", "input": "hi", "stream": True}, "openai",
                 [chunk_event("one"), chunk_event(" two"), b"data: [DONE]\n\n"], id="responses-from-chat-done"),
]


@pytest.mark.parametrize(("path", "body", "kind", "events"), _LONE_CR_ENDS)
async def test_a_lone_cr_stream_whose_end_marker_ends_the_body_is_whole(upstreams, proxy, path, body, kind, events):
    """A reviewer's stream framed by lone CRs: the end marker's last CR is the body's last byte, held by the
    framer for an LF that never came, so the relay found no end marker, ended the client's stream with a
    stream_interrupted event after ``[DONE]`` and counted a failure against a healthy target (three opened
    its breaker). A CR that ends the body ends its line, as the first-token gate reads it."""
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    upstream_path = "/v1/messages" if kind == "anthropic" else "/v1/chat/completions"
    up = await upstreams({upstream_path: _framed_by_lone_crs(events)})
    provider = {"kind": kind, "base_url": up.url + "/v1"}
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": provider}), observers=[access])
    async with aiohttp.ClientSession() as session, session.post(p.url + path, json=body) as resp:
        wire = await asyncio.wait_for(resp.read(), 5)
    await released(p)
    await access.close()
    assert b"stream_interrupted" not in wire and b"one" in wire, wire
    assert orjson.loads(lines.getvalue())["error"] is None, lines.getvalue()
    blameless(p)
