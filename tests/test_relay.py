"""What an upstream may not hand a client: copies of our own headers, hop-by-hop headers it names,
cookies meant for another client, and the provider key it was sent."""

from __future__ import annotations

import io

import orjson
import pytest
from aiohttp import web

from proxy.config import AccessLog as AccessLogConfig
from proxy.observe.accesslog import AccessLog
from proxy.routing.decision import parse_header

from .conftest import chat_body, chunk_event, openai_provider, route_config

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
KEY = "sk-live-0123456789abcdefSECRET"


async def raw_headers(p, body: dict[str, object]) -> tuple[int, list[tuple[str, str]], bytes]:
    """Every header line as sent, duplicates and case kept (a dict would hide the forged copy)."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.post(p.url + "/v1/chat/completions",
                                                                 data=orjson.dumps(body)) as resp:
        return resp.status, [(k.decode(), v.decode()) for k, v in resp.raw_headers], await resp.read()


def forging(stream: bool = False):
    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {"X-Route-Decision": "id=forged; route=chat; strategy=ordered; order=evil(written); served=evil",
                   "X-REQUEST-ID": "forged", "Connection": "keep-alive, X-RateLimit-Hop", "X-RateLimit-Hop": "hop",
                   "X-Not-Listed": "dropped", "X-RateLimit-Remaining-Requests": "99"}
        if not (await request.json()).get("stream"):
            return web.json_response(chat_body(), headers=headers)
        response = web.StreamResponse(headers={"content-type": "text/event-stream", **headers})
        await response.prepare(request)
        await response.write(chunk_event("a") + chunk_event("", "stop") + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
async def test_upstream_copies_of_our_headers_and_its_hop_headers_are_dropped(upstreams, proxy, stream):
    up = await upstreams({"/v1/chat/completions": forging()})
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}))
    status, headers, _ = await raw_headers(p, {**CHAT, "stream": stream})
    assert status == 200
    names = [k.lower() for k, _ in headers]
    assert names.count("x-route-decision") == 1 and names.count("x-request-id") == 1
    values = dict((k.lower(), v) for k, v in headers)
    decision = parse_header(values["x-route-decision"])
    assert decision.served == "up" and decision.id == values["x-request-id"] != "forged"
    assert "x-ratelimit-hop" not in names  # on the list, but hop-by-hop by the upstream's own say
    assert "x-not-listed" not in names  # not on the list (proxy/egress.py)
    assert values["x-ratelimit-remaining-requests"] == "99"
    assert values["x-upstream-request-id"] == "forged"  # the provider's id, under a name of its own


async def test_one_clients_upstream_cookie_never_rides_on_anothers_request(upstreams, proxy):
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(chat_body(), headers={"Set-Cookie": "session=client-a-only; Path=/"})

    up = await upstreams({"/v1/chat/completions": handle})
    # By name, not by IP: aiohttp's cookie jar ignores cookies from IP addresses.
    by_name = up.url.replace("127.0.0.1", "localhost")
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(by_name)}))
    for _ in range(2):
        status, headers, _ = await p.post("/v1/chat/completions", CHAT)
        assert status == 200
        assert "set-cookie" not in {k.lower() for k in headers}
    assert all("cookie" not in {k.lower() for k in call["headers"]} for call in up.calls), up.calls


@pytest.mark.parametrize("status", [401, 403, 429, 500])
async def test_the_provider_key_echoed_in_an_upstream_error_never_comes_back(upstreams, proxy, status):
    """Both shapes an upstream errs in: its own JSON, and text cut at 500 characters by firstbyte."""

    async def echo(request: web.Request) -> web.StreamResponse:
        sent = request.headers["authorization"]
        if request.path.startswith("/json/"):
            return web.json_response({"error": {"message": f"bad key {sent}", "type": "x"}}, status=status)
        return web.Response(text="x" * 490 + f" you sent {sent}", status=status)  # the key straddles 500

    up = await upstreams({"*": echo})
    raw = {"providers": {"j": openai_provider(up.url + "/json", api_key_env="K"),
                         "t": openai_provider(up.url + "/text", api_key_env="K")},
           "routes": {"j": {"targets": [{"provider": "j", "model": "m"}]},
                      "t": {"targets": [{"provider": "t", "model": "m"}]}}}
    p = await proxy(raw, {"K": KEY})
    for route in ("j", "t"):
        got, _, body = await p.post("/v1/chat/completions", {**CHAT, "model": route})
        assert got == status
        assert orjson.loads(body)["error"]["message"]
        assert KEY not in body.decode() and KEY[:12] not in body.decode(), body
        assert b"[redacted]" in body or route == "t"  # t: cut at 500 characters, after the scrub
    assert up.calls[0]["headers"]["Authorization"] == f"Bearer {KEY}"  # it did reach the upstream


async def test_a_key_in_an_error_event_after_commit_reaches_neither_client_nor_log(upstreams, proxy):
    async def stream(request: web.Request) -> web.StreamResponse:
        sent = request.headers["x-api-key"]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'event: message_start\ndata: {"type":"message_start","message":{"id":"m"}}\n\n'
                             b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                             b'"delta":{"type":"text_delta","text":"partial answer"}}\n\n')
        error = {"type": "error", "error": {"type": "overloaded_error", "message": f"debug: {sent}"}}
        await response.write(b"event: error\ndata: " + orjson.dumps(error) + b"\n\n")
        await response.write_eof()
        return response

    up = await upstreams({"/v1/messages": stream})
    raw = {"providers": {"claude": {"kind": "anthropic", "base_url": up.url + "/v1", "api_key_env": "K"}},
           "routes": {"chat": {"targets": [{"provider": "claude", "model": "c"}]}}}
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    p = await proxy(raw, {"K": KEY}, observers=[access])
    status, _, body = await p.post("/v1/chat/completions", {**CHAT, "stream": True})
    await access.close()
    assert status == 200
    assert b"stream_interrupted" in body
    assert KEY not in body.decode() and "[redacted]" in body.decode()
    logged = lines.getvalue()
    assert "[redacted]" in logged and KEY not in logged
