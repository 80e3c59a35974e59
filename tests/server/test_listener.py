"""Client connections over raw sockets: slow heads and bodies, idle keep-alive, the connection cap,
aiohttp's own parser errors, the ops listener's 404, and the connection metrics."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.gateway import Gateway
from proxy.observe.hub import Hub
from proxy.server.listener import LINGER, SILENT_SECS, Guard, GuardedRunner
from proxy.server.ops import build_ops_app
from proxy.server.replies import request_line

from ..conftest import (
    Recorder,
    assert_openai_error,
    exchange,
    make_config,
    ok_handler,
    openai_provider,
    post_head,
    route_config,
    until,
)

CHAT = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
FAST = {"header_timeout": 0.3, "body_timeout": 0.3, "keepalive_timeout": 0.3, "max": 8}


@pytest.fixture
async def guarded(upstreams, proxy):
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    return await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                        "connections": FAST})


def scrape(hub: Hub, gw: Gateway) -> tuple[bytes, str]:
    """/metrics as the ops handler renders it: the state's snapshot and the last reload's word."""
    return hub.scrape(gw.state.snapshot(gw.config, gw.clock()), gw.config.routes, gw.loaded)


async def closed_within(reader: asyncio.StreamReader, secs: float) -> tuple[bytes, float]:
    """What the server sent before it closed, and when it closed (the test fails if it never does)."""
    t0 = time.monotonic()
    data = await asyncio.wait_for(reader.read(), secs)
    return data, time.monotonic() - t0


@pytest.mark.timeout(10)
async def test_a_head_trickled_byte_by_byte_is_cut_after_the_header_timeout(guarded):
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
    head = post_head(len(CHAT))

    async def trickle() -> None:
        for byte in head[:-2]:  # never the final blank line
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    task = asyncio.create_task(trickle())
    data, took = await closed_within(reader, 3)
    task.cancel()
    writer.close()
    assert 0.3 <= took < 1.5
    status, _, body = data.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408")
    assert_openai_error(408, body, 408, "header_timeout")


@pytest.mark.timeout(10)
async def test_a_connection_that_never_speaks_is_closed(guarded):
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
    _, took = await closed_within(reader, 3)
    writer.close()
    assert took < 1.5


@pytest.mark.timeout(10)
async def test_a_body_that_stalls_gets_a_408(guarded):
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
    writer.write(post_head(len(CHAT)) + CHAT[:10])  # the head, then a tenth of the body, then nothing
    data, took = await closed_within(reader, 3)
    writer.close()
    assert took < 1.5
    top, _, body = data.partition(b"\r\n\r\n")
    assert top.startswith(b"HTTP/1.1 408"), data
    assert_openai_error(408, body, 408, "body_timeout")


@pytest.mark.timeout(10)
async def test_an_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout(guarded):
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    first = await reader.readuntil(b'"alive"}')
    assert first.startswith(b"HTTP/1.1 200")
    rest, took = await closed_within(reader, 3)  # idle now: aiohttp's default would wait an hour
    writer.close()
    assert rest == b"" and took < 1.5


@pytest.mark.timeout(15)
async def test_past_the_cap_a_connection_is_answered_503_and_the_cap_recovers(guarded):
    idle = [await asyncio.open_connection("127.0.0.1", guarded.port) for _ in range(8)]
    await asyncio.sleep(0.05)
    status, headers, body = await exchange(guarded.port, post_head(len(CHAT)), CHAT)
    assert_openai_error(status, body, 503, "too_many_connections")
    assert headers["retry-after"] == "1"
    for _, writer in idle:
        writer.close()
    await asyncio.sleep(0.1)
    status, _, body = await exchange(guarded.port, post_head(len(CHAT)), CHAT)
    assert status == 200, body


@pytest.mark.timeout(10)
async def test_a_connection_past_the_cap_is_closed_within_a_second_even_if_it_says_nothing(guarded):
    guard = guarded.guards[0]
    held = [await asyncio.open_connection("127.0.0.1", guarded.port) for _ in range(guard.max)]
    await asyncio.sleep(0.05)
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
    data, took = await closed_within(reader, 3)
    assert data.startswith(b"HTTP/1.1 408")  # it never asked
    assert took < 1.5
    assert guard.closed["over_capacity"] == 1
    for _, w in [*held, (reader, writer)]:
        w.close()


@pytest.mark.timeout(10)
async def test_at_the_hard_limit_a_new_connection_evicts_the_longest_idle_one(guarded):
    guard = guarded.guards[0]
    held = []
    for _ in range(guard.hard_max):
        held.append(await asyncio.open_connection("127.0.0.1", guarded.port))
        await asyncio.sleep(0.005)  # the first one has waited longest
    await asyncio.sleep(0.05)
    status, _, body = await exchange(guarded.port, post_head(len(CHAT)), CHAT)
    assert_openai_error(status, body, 503, "too_many_connections")  # an answer, not an empty reply
    data, _ = await closed_within(held[0][0], 1)
    assert data == b"" and guard.closed["evicted"] >= 1
    for _, w in held:
        w.close()


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def ask_healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One ``GET /healthz`` on a kept-alive connection, read to the end of its answer."""
    writer.write(HEALTHZ)
    answer = await asyncio.wait_for(reader.readuntil(b'"alive"}'), 3)
    assert answer.startswith(b"HTTP/1.1 200"), answer


@pytest.mark.timeout(15)
async def test_at_the_cap_the_connection_idle_longest_makes_room_for_a_new_client(upstreams, proxy):
    """``max`` keep-alive connections that each asked once and idle between requests (issue 31: 200
    of them asking /healthz every 12 s locked every new client out with 503): the newcomer is served,
    and the one idle longest is closed for it, not one that asked since."""
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                     "connections": {"max": 8, "keepalive_timeout": 30, "header_timeout": 5}})
    guard = p.guards[0]
    held = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(guard.max)]
    for conn in held:
        await ask_healthz(*conn)
        await asyncio.sleep(0.01)
    await ask_healthz(*held[0])  # the first asked again: now the second has idled longest
    newcomers = []
    for newcomer in range(2):  # each stays open, kept alive: the cap stays reached
        newcomers.append(await asyncio.open_connection("127.0.0.1", p.port))
        await ask_healthz(*newcomers[-1])
        data, _ = await closed_within(held[1 + newcomer][0], 1)
        assert data == b""
    status, _, body = await exchange(p.port, post_head(len(CHAT)), CHAT)  # a chat call, as a third newcomer
    assert status == 200, body
    assert guard.closed["idle_evicted"] == 3 and guard.closed["over_capacity"] == 0
    for conn in [held[0], *held[4:], *newcomers]:  # the others are still open and kept alive
        await ask_healthz(*conn)
    for _, writer in held + newcomers:
        writer.close()


@pytest.mark.timeout(15)
async def test_at_the_cap_a_connection_with_a_request_under_way_is_never_evicted(upstreams, proxy):
    """Connections waiting for their streamed answer are not idle: a newcomer past the cap gets its 503."""
    gate = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await request.read()
        await gate.wait()
        return web.json_response({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                               "finish_reason": "stop"}]})

    up = await upstreams({"/v1/chat/completions": slow})
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                     "connections": {"max": 4, "keepalive_timeout": 30, "header_timeout": 5}})
    guard = p.guards[0]
    busy = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(guard.max)]
    for _, writer in busy:
        writer.write(post_head(len(CHAT)) + CHAT)
    while len(up.calls) < guard.max:
        await asyncio.sleep(0.02)
    status, _, body = await exchange(p.port, post_head(len(CHAT)), CHAT)
    assert_openai_error(status, body, 503, "too_many_connections")
    gate.set()
    for reader, writer in busy:
        answer, _ = await closed_within(reader, 3)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
        writer.close()
    assert guard.closed["idle_evicted"] == 0


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", id="content-length-and-chunked"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
                     id="oversized-header"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n", id="bad-header-name"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello\r\n\r\n", id="tls-to-http"),
    ],
)
async def test_aiohttps_own_parser_errors_answer_in_the_openai_shape(guarded, head):
    status, _, body = await exchange(guarded.port, head)
    assert_openai_error(status, body, 400)


@pytest.mark.parametrize("extra", [
    pytest.param(b"Content-Encoding: br\r\n", id="brotli-body"),
    pytest.param(b"Transfer-Encoding: chunked\r\n", id="content-length-and-chunked"),
])
async def test_a_request_aiohttps_parser_refuses_has_a_request_id_and_an_access_log_line(upstreams, proxy, extra):
    """A reviewer's requests refused by aiohttp's own parser before any handler: the 400 had no
    ``x-request-id`` and the access log no line, so an operator could not find it."""
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    recorder = Recorder()
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                    observers=[recorder])
    status, headers, body = await exchange(p.port, post_head(len(CHAT), extra=extra), CHAT)
    assert_openai_error(status, body, 400, "http_400")
    if b"br" in extra:  # what the client can do, not aiohttp's "Please install `Brotli`"
        message = orjson.loads(body)["error"]["message"]
        assert message == ("Malformed HTTP request: Content-Encoding brotli (br) is not supported: send the body "
                           "as it is, or gzip or deflate it (Content-Encoding: gzip)"), message
    rid = headers.get("x-request-id")
    await until(lambda: bool(recorder.seen))
    assert rid and [(f.status, f.request_id, f.error) for f in recorder.seen] == [(400, rid, "http_400")]


async def test_the_ops_listener_answers_unknown_paths_in_the_openai_shape():
    config = make_config({"providers": {"s": {"kind": "simulated"}},
                          "routes": {"chat": {"targets": [{"provider": "s", "model": "m"}]}}})
    gw = Gateway(config)
    runner = GuardedRunner(build_ops_app(gw, None), Guard(config.connections, "ops"))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        status, _, body = await exchange(port, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        err = assert_openai_error(status, body, 404, "http_404")
        assert "/healthz" in str(err["message"])
    finally:
        await runner.cleanup()


@pytest.mark.timeout(15)
async def test_connections_and_their_cuts_are_metrics(upstreams, proxy):
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    raw = {**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}), "connections": FAST}
    hub = Hub(make_config(raw))
    p = await proxy(raw, observers=hub.observers)
    held = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(3)]
    await asyncio.sleep(0.6)  # past the head deadline: all three are cut
    hub.connections.extend(p.guards)  # as `firstbyte serve` registers its listeners'
    body, _ = scrape(hub, p.gateway)
    await asyncio.sleep(LINGER)  # the cut ones are closed after their 408 lingered
    open_now = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(2)]
    await asyncio.sleep(0.05)
    body2, _ = scrape(hub, p.gateway)
    for _, w in held + open_now:
        w.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body.decode()) for s in family.samples}
    assert samples[("firstbyte_connections_closed_total",
                    (("listener", "main"), ("reason", "header_timeout")))] == 3
    later = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in text_string_to_metric_families(body2.decode()) for s in family.samples}
    assert later[("firstbyte_connections", (("listener", "main"),))] == 2


@pytest.mark.timeout(15)
async def test_at_the_cap_a_connection_silent_for_a_second_makes_room_for_a_new_client(upstreams, proxy):
    """A reviewer held `max` sockets that never said a word (reopened each header_timeout, they would
    lock everyone out with 503 for good): at the cap, the one silent longest past SILENT_SECS gives way."""
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                     "connections": {"max": 8, "header_timeout": 10}})
    guard = p.guards[0]
    silent = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(guard.max)]
    await asyncio.sleep(SILENT_SECS + 0.2)  # the sockets' silence is the point: real time, on a real socket
    status, _, body = await exchange(p.port, post_head(len(CHAT)), CHAT)
    assert status == 200, body
    data, _ = await closed_within(silent[0][0], 1)  # the first, silent longest, made the room
    assert data == b"" and guard.closed["evicted"] == 1 and guard.closed["over_capacity"] == 0
    for _, w in silent:
        w.close()


async def test_the_listeners_own_408_and_503_have_a_request_id_and_an_access_log_line(upstreams, proxy):
    """A reviewer's slow head (408) and a connection past the cap (503): answered by the listener before
    any handler, they had no ``x-request-id`` and no access log line, so an operator could not find them."""
    gate = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        await request.read()
        await gate.wait()
        return web.json_response({})

    up = await upstreams({"/v1/chat/completions": slow})
    recorder = Recorder()
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                     "connections": {"max": 2, "keepalive_timeout": 30, "header_timeout": 0.3}},
                    observers=[recorder])
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never the blank line
    data, _ = await closed_within(reader, 3)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert_openai_error(408, body, 408, "header_timeout")
    timed_out = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])["x-request-id"]
    busy = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(2)]
    for _, w in busy:
        w.write(post_head(len(CHAT)) + CHAT)
    while len(up.calls) < 2:
        await asyncio.sleep(0.02)
    status, headers, body = await exchange(p.port, post_head(len(CHAT)), CHAT)
    assert_openai_error(status, body, 503, "too_many_connections")
    over = headers.get("x-request-id")
    gate.set()
    for _, w in busy:
        w.close()
    await until(lambda: len([f for f in recorder.seen if f.decision is None]) >= 2)
    assert [(f.status, f.request_id, f.error) for f in recorder.seen if f.decision is None] == [
        (408, timed_out, "header_timeout"), (503, over, "too_many_connections")]
    assert over and timed_out and over != timed_out


@pytest.mark.parametrize(("head", "said"), [
    pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", ("POST", "/v1/chat/completions"),
                 id="request-line-then-a-stall"),
    pytest.param(b"GET /v1/models?limit=5 HTTP/1.1\r\n", ("GET", "/v1/models"), id="query-left-out"),
    pytest.param(b"GET /v1/a%20b HTTP/1.0\n", ("GET", "/v1/a b"), id="percent-decoded-as-aiohttp-does"),
    pytest.param(b"POST /v1/chat/comp", ("-", "-"), id="request-line-itself-cut"),
    pytest.param(b"", ("-", "-"), id="nothing"),
    pytest.param(b"\x16\x03\x01\x02\x00", ("-", "-"), id="tls-hello"),
    pytest.param(b"get / HTTP/1.1\r\n", ("-", "-"), id="not-a-method"),
])
def test_a_head_cut_short_is_logged_with_its_request_line(head: bytes, said: tuple[str, str]) -> None:
    assert request_line(head) == said


async def test_a_408_for_a_head_that_stalled_after_its_request_line_logs_its_method_and_path(upstreams, proxy):
    """The 408's access line read ``method=- path=-`` though the request line came (in two reads here)."""
    up = await upstreams({"/v1/chat/completions": ok_handler()})
    recorder = Recorder()
    p = await proxy({**route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                     "connections": {"header_timeout": 0.3}}, observers=[recorder])
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(b"POST /v1/chat/com")
    await asyncio.sleep(0.05)
    writer.write(b"pletions HTTP/1.1\r\nHost: x\r\n")  # never the blank line
    data, _ = await closed_within(reader, 3)
    writer.close()
    assert data.startswith(b"HTTP/1.1 408")
    await until(lambda: len(recorder.seen) >= 1)
    assert [(f.status, f.method, f.path) for f in recorder.seen] == [(408, "POST", "/v1/chat/completions")]


@pytest.mark.parametrize("head", [
    pytest.param(post_head(len(CHAT), extra=b"Content-Encoding: br\r\n") + CHAT, id="brotli-body"),
    pytest.param(post_head(len(CHAT), extra=b"Transfer-Encoding: chunked\r\n") + CHAT, id="content-length-and-chunked"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n", id="bad-header-name"),
])
async def test_a_request_aiohttps_parser_refuses_is_answered_in_http_1_1(guarded, head):
    """aiohttp answers a request it could not parse as its stand-in request says, HTTP/1.0, to a client
    that spoke 1.1 (a reviewer's brotli body); a server answers in the highest 1.x it speaks."""
    reader, writer = await asyncio.open_connection("127.0.0.1", guarded.port)
    try:
        writer.write(head)
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    assert data.startswith(b"HTTP/1.1 400 "), data[:60]
