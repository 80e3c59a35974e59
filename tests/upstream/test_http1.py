"""The upstream HTTP/1.1 client against real sockets on loopback.

Each server here is a plain asyncio server that reads request heads by hand and
answers with scripted bytes, so the test sees exactly what went over the wire:
how many connections were opened, what the request head said, when the client
closed its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import orjson
import pytest

from proxy.upstream.http1 import QUIET, ConnectFailed, MalformedAnswer, Origin, Pool, _endpoint, request_head
from proxy.upstream.transport import failure_of

from ..anthropic_fakes import anthropic_provider, messages_handler
from ..conftest import route_config
from .conftest import ca_and_leaf, read_head, reply, reused, whole


async def until(check: Callable[[], bool]) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


@pytest.mark.parametrize(
    ("url", "origin", "head"),
    [
        pytest.param("http://api.example/v1/chat", Origin("http", "api.example", 80),
                     " /v1/chat HTTP/1.1\r\nHost: api.example\r\n", id="default-port-not-in-host"),
        pytest.param("https://api.example:8443/v1/x?a=1", Origin("https", "api.example", 8443),
                     " /v1/x?a=1 HTTP/1.1\r\nHost: api.example:8443\r\n", id="port-and-query"),
        pytest.param("http://[::1]:9000/v1", Origin("http", "::1", 9000),
                     " /v1 HTTP/1.1\r\nHost: [::1]:9000\r\n", id="ipv6-in-brackets"),
        pytest.param("http://h", Origin("http", "h", 80), " / HTTP/1.1\r\nHost: h\r\n", id="no-path-is-slash"),
    ],
)
def test_an_endpoint_is_its_origin_and_request_target(url: str, origin: Origin, head: str) -> None:
    endpoint = _endpoint(url)
    assert endpoint.origin == origin
    assert endpoint.head == head


@pytest.mark.parametrize("url", [pytest.param("ftp://h/x", id="not-http"), pytest.param("/v1/x", id="relative")])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        _endpoint(url)


@pytest.mark.parametrize("value", ["key\n", "a\r\nx-evil: 1", "nul\0"])
def test_a_header_that_could_end_early_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="newline or NUL"):
        request_head("POST", _endpoint("http://h/x"), {"authorization": value}, 0)


def test_the_request_head_carries_the_headers_and_the_length() -> None:
    head = request_head("POST", _endpoint("http://h:81/v1/x"), {"authorization": "Bearer k"}, 12)
    assert head == (b"POST /v1/x HTTP/1.1\r\nHost: h:81\r\nauthorization: Bearer k\r\n"
                    b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nContent-Length: 12\r\n\r\n")


@pytest.mark.parametrize(
    ("calls", "kept"),
    [
        pytest.param([("POST", "http://h/x", {"authorization": "Bearer k"}, 12),
                      ("POST", "http://h/x", {"authorization": "Bearer k"}, 3)], 1, id="same-target-new-length"),
        pytest.param([("POST", "http://h/x", {"authorization": "Bearer k"}, 12),
                      ("POST", "http://h/x", {"authorization": "Bearer k", "traceparent": "00-a-b-01"}, 12)],
                     2, id="another-header"),
        pytest.param([("POST", "http://h/x", {"authorization": "Bearer k"}, 12),
                      ("POST", "http://h/y", {"authorization": "Bearer k"}, 12)], 2, id="another-url"),
        pytest.param([("POST", "http://h/x", {"authorization": "Bearer k"}, 12),
                      ("POST", "http://h/x", {"authorization": "Bearer j"}, 12)], 2, id="another-key"),
    ],
)
def test_the_pool_keeps_a_heads_start_and_writes_the_same_bytes(calls: list[tuple[str, str, dict[str, str], int]],
                                                                 kept: int) -> None:
    """Built once per method, URL and headers (~6 us a call before the write), the head is still the
    very bytes ``request_head`` writes, its length each call's own."""
    pool = Pool()
    for method, url, headers, length in calls:
        assert pool.head(method, url, headers, length)[1] == request_head(method, _endpoint(url), headers, length)
    assert len(pool._heads) == kept


def test_a_header_that_could_end_early_is_refused_by_the_pool_every_time() -> None:
    pool = Pool()
    for _ in range(2):
        with pytest.raises(ValueError, match="newline or NUL"):
            pool.head("POST", "http://h/x", {"authorization": "key\n"}, 0)
    assert not pool._heads


async def test_a_connection_read_to_its_end_is_reused(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b'{"ok":1}', "Content-Type: application/json"))
    pool = Pool()
    for _ in range(3):
        assert await whole(pool, server.url + "/v1/x", b'{"a":1}', {"authorization": "Bearer k"}) == (200, b'{"ok":1}')
        await asyncio.sleep(QUIET)
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/x HTTP/1.1\r\n")
    assert server.requests[0].endswith(b'\r\n\r\n{"a":1}')
    pool.close()
    await until(lambda: server.closed == 1)


async def test_an_answer_not_read_to_its_end_closes_its_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b"x" * 10)[:-5])  # five bytes of ten sent; the rest never comes
    pool = Pool()
    answer = await pool.request("POST", server.url + "/", {}, b"", 5.0)
    assert await answer.content.readany() == b"xxxxx"
    pool.release(answer)  # the rest would be read as the next answer's head
    await until(lambda: server.closed == 1)
    second = await pool.request("POST", server.url + "/", {}, b"", 5.0)
    assert server.connections == 2
    pool.release(second)
    pool.close()


async def test_an_answer_that_says_close_is_not_reused(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b"{}", "Connection: close"))
    pool = Pool()
    await whole(pool, server.url + "/")
    await whole(pool, server.url + "/")
    assert server.connections == 2
    pool.close()


async def test_a_connection_the_upstream_closed_while_idle_is_not_used(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b"{}"))
    pool = Pool()
    await whole(pool, server.url + "/")
    server.writers[0].close()  # the upstream's keep-alive ran out
    await until(lambda: server.closed == 1)
    await asyncio.sleep(0.05)  # the FIN reaches the client's protocol
    assert await whole(pool, server.url + "/") == (200, b"{}")
    assert server.connections == 2
    pool.close()


async def test_a_connection_idle_past_keepalive_is_closed_not_reused(serve) -> None:  # type: ignore[no-untyped-def]
    now = [100.0]
    server = await serve(lambda _: reply(b"{}"))
    pool = Pool(keepalive=15.0, clock=lambda: now[0])
    await whole(pool, server.url + "/")
    now[0] += 14.9
    await whole(pool, server.url + "/")
    assert server.connections == 1
    now[0] += 15.0
    await whole(pool, server.url + "/")
    assert server.connections == 2
    await until(lambda: server.closed == 1)
    pool.close()


async def test_chunked_and_gzip_bodies_are_decoded(serve) -> None:  # type: ignore[no-untyped-def]
    packed = gzip.compress(b"data: hello\n\n" * 50)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
    chunked += b"".join(b"%x\r\n%s\r\n" % (len(packed[i:i + 100]), packed[i:i + 100])
                        for i in range(0, len(packed), 100)) + b"0\r\n\r\n"
    server = await serve(lambda _: chunked)
    pool = Pool()
    assert await whole(pool, server.url + "/") == (200, b"data: hello\n\n" * 50)
    assert await reused(pool, server.url + "/") == (200, b"data: hello\n\n" * 50)
    assert server.connections == 1
    pool.close()


async def test_an_informational_answer_is_skipped(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: b"HTTP/1.1 100 Continue\r\n\r\n" + reply(b"{}", status="201 Created"))
    pool = Pool()
    assert await whole(pool, server.url + "/") == (201, b"{}")
    pool.close()


async def test_a_body_past_one_write_arrives_whole(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda request: reply(str(len(request.partition(b"\r\n\r\n")[2])).encode()))
    pool = Pool()
    assert await whole(pool, server.url + "/", b"y" * 300_000) == (200, b"300000")
    pool.close()


async def test_a_garbled_answer_is_a_client_error_named_as_a_reset(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: b"NOT HTTP AT ALL\r\n\r\n")
    pool = Pool()
    with pytest.raises(MalformedAnswer, match="BadStatusLine") as caught:
        await pool.request("POST", server.url + "/", {}, b"", 5.0)
    kind, message = failure_of(caught.value)  # type: ignore[misc]
    assert (kind, message.partition(":")[0]) == ("reset", "upstream sent a malformed answer")
    await until(lambda: server.closed == 1)
    pool.close()


async def test_a_close_before_the_answer_is_a_reset(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: None)
    pool = Pool()
    task = asyncio.ensure_future(pool.request("POST", server.url + "/", {}, b"", 5.0))
    await until(lambda: len(server.requests) == 1)
    server.writers[0].close()
    with pytest.raises(aiohttp.ServerDisconnectedError) as caught:
        await task
    assert failure_of(caught.value) == ("reset", "upstream connection failed: ServerDisconnectedError")
    pool.close()


async def test_a_cancelled_call_closes_its_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: None)  # never answers
    pool = Pool()
    task = asyncio.ensure_future(pool.request("POST", server.url + "/", {}, b"", 5.0))
    await until(lambda: len(server.requests) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: server.closed == 1)  # the upstream sees the call dropped
    pool.close()


async def test_a_refused_connect_is_named_refused() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = Pool()
    with pytest.raises(ConnectFailed) as caught:
        await pool.request("POST", f"http://127.0.0.1:{port}/", {}, b"", 5.0)
    kind, message = failure_of(caught.value)  # type: ignore[misc]
    assert kind == "refused"
    assert message.startswith(f"cannot connect to upstream 127.0.0.1:{port}: ")


async def test_tls_to_a_plain_server_is_named_tls() -> None:
    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the client's hello
        writer.write(reply(b"{}", status="400 Bad Request"))  # what a plain HTTP server says to it
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(plain, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool()
    try:
        with pytest.raises(ConnectFailed) as caught:
            await pool.request("POST", f"https://127.0.0.1:{port}/", {}, b"", 5.0)
    finally:
        server.close()
        await server.wait_closed()
    kind, message = failure_of(caught.value)  # type: ignore[misc]
    assert kind == "tls"
    assert message.startswith("TLS failure talking to upstream: ")


async def test_a_closed_pool_closes_its_idle_connections_and_opens_no_more(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b"{}"))
    pool = Pool()
    await whole(pool, server.url + "/")
    pool.close()
    await until(lambda: server.closed == 1)
    with pytest.raises(aiohttp.ClientConnectionError, match="closed"):
        await pool.request("POST", server.url + "/", {}, b"", 5.0)


async def test_a_busy_origin_closes_the_idle_connections_it_no_longer_reaches(serve) -> None:  # type: ignore[no-untyped-def]
    now = [100.0]
    server = await serve(lambda _: reply(b"{}"))
    pool = Pool(keepalive=15.0, clock=lambda: now[0])
    answers = [await pool.request("POST", server.url + "/", {}, b"", 5.0) for _ in range(3)]  # a burst of three
    for answer in answers:
        await answer.content.read()
        pool.release(answer)
    for _ in range(4):  # then one call at a time, every 6 s: the newest connection serves each
        now[0] += 6.0
        await whole(pool, server.url + "/")
    assert server.connections == 3
    await until(lambda: server.closed == 2)  # the two left at the bottom since t=100, past keep-alive
    pool.close()
    await until(lambda: server.closed == 3)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def _answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(OK)
        await writer.drain()
        await reader.read()  # until the client lets go
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def blackhole() -> AsyncIterator[int]:
    """A loopback port that drops SYNs: a listener whose accept queue is full and never drained,
    as a host with a blackholed IPv6 route (or a dead address of several) looks to connect()."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    await asyncio.sleep(0.05)
    yield port
    for s in fillers:
        s.close()
    listener.close()


# Happy eyeballs: a dead first address of several does not eat the whole connect deadline.

async def test_connect_moves_on_to_the_next_address_when_the_first_does_not_answer(blackhole, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A name with two addresses (AAAA + A; or two A of which one is dead): the next address is
    tried 0.25 s after the first, as aiohttp's connector does, not after the connect deadline."""
    server = await asyncio.start_server(_answer_ok, "127.0.0.1", 0)
    good = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()

    async def resolve(host, port, **kwargs):  # type: ignore[no-untyped-def]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", blackhole)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", good))]

    monkeypatch.setattr(loop, "getaddrinfo", resolve)
    pool = Pool()
    started = time.monotonic()
    try:
        assert await whole(pool, "http://dual-stack.test/v1/x") == (200, b"ok")
        assert time.monotonic() - started < 1.5
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


# A trailing-dot FQDN (the k8s "svc.cluster.local." habit): resolved with its dot, but SNI, the
# certificate check and Host use the name without it, as aiohttp does.


async def test_a_trailing_dot_host_is_verified_and_sent_without_its_dot(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ca, leaf = ca_and_leaf(tmp_path, "upstream.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(leaf)
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(OK)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()

    async def resolve(host, port, **kwargs):  # type: ignore[no-untyped-def]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(loop, "getaddrinfo", resolve)
    pool = Pool(ssl_context=ssl.create_default_context(cafile=str(ca)))
    try:
        assert await whole(pool, f"https://upstream.test.:{port}/v1/x") == (200, b"ok")
        assert f"\r\nHost: upstream.test:{port}\r\n".encode() in heads[0]
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


def test_the_host_header_of_a_trailing_dot_name_has_no_dot() -> None:
    """As aiohttp's (yarl's host_port_subcomponent): a virtual host matched on Host sees the name."""
    assert _endpoint("http://vllm.ns.svc.cluster.local./v1").head.endswith("\r\nHost: vllm.ns.svc.cluster.local\r\n")


# A provider's own Accept / Accept-Encoding replaces the default: only one goes out.

@pytest.mark.parametrize(("name", "value"), [("Accept-Encoding", "identity"), ("accept", "text/event-stream")])
def test_a_provider_header_replaces_the_default_of_the_same_name(name: str, value: str) -> None:
    """ClientSession added Accept and Accept-Encoding only when the caller had not set them
    (update_auto_headers); config allows both in a provider's ``headers:``. A provider that asks for
    ``Accept-Encoding: identity`` (an SSE stream a middlebox buffers when gzipped) must not also
    send ``gzip, deflate``."""
    head = request_head("POST", _endpoint("http://h/v1/x"), {name: value}, 2).decode().lower()
    lines = [line for line in head.split("\r\n") if line.startswith(name.lower() + ":")]
    assert lines == [f"{name.lower()}: {value}"]


# A client's anthropic-beta with a byte that is not UTF-8 goes on as that byte: it must not become
# an unclassified UnicodeEncodeError (a 500 and a logged traceback per request, from any client).

async def test_an_undecodable_byte_in_anthropic_beta_is_not_a_500(upstreams, proxy) -> None:  # type: ignore[no-untyped-def]
    up = await upstreams({"/v1/messages": messages_handler("Hello!")})
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}], {"claude": anthropic_provider(up.url)}))
    body = orjson.dumps({"model": "chat", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"anthropic-beta: prompt-caching-2024-07-31\xff\r\nConnection: close\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.split(b"\r\n")[0] == b"HTTP/1.1 200 OK", answer[:300]


# An answer that came back before the request body was sent: were the connection pooled with the
# rest of the body still queued behind it, the upstream (which never read it) would read the body
# as the next request, and the next caller would get the answer meant for that garbage.

async def test_an_answer_before_the_body_was_sent_does_not_put_the_connection_back() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, length = await read_head(reader)
                if head.startswith(b"POST /big "):
                    writer.write(reply(b"no", status="413 Payload Too Large"))  # early, body left unread
                elif head.startswith(b"POST /small "):
                    await reader.readexactly(length)
                    writer.write(reply(b"small"))
                else:  # what it made of the unread body
                    await reader.readexactly(length)
                    writer.write(reply(b"WRONG", status="400 Bad Request"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=64 * 2**20)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = Pool()
    try:
        assert await asyncio.wait_for(whole(pool, url + "/big", b"z" * (16 * 2**20)), 10) == (413, b"no")
        assert await asyncio.wait_for(whole(pool, url + "/small"), 10) == (200, b"small")
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


# Idle connections of an origin nobody calls any more (after a burst, or removed by a reload) are
# closed past keep-alive by the pool's one timer, as aiohttp's connector closed them.

async def test_idle_connections_of_a_quiet_origin_close_after_keepalive(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b"{}"))
    pool = Pool(keepalive=0.2)
    answers = [await pool.request("POST", server.url + "/", {}, b"", 5.0) for _ in range(3)]
    for answer in answers:
        await answer.content.read()
        pool.release(answer)
    try:
        await until(lambda: server.closed == 3)  # up to 2 s: ten times the keep-alive
    finally:
        pool.close()


async def test_an_upstream_speaking_while_idle_is_cut_off_not_read_as_the_next_answer(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b"{}"))
    pool = Pool()
    await whole(pool, server.url + "/")
    server.writers[0].write(b"HTTP/1.1 200 OK\r\nContent-Len")  # half a head nobody asked for
    await until(lambda: server.closed == 1)
    assert await whole(pool, server.url + "/") == (200, b"{}")
    assert server.connections == 2
    pool.close()


async def test_a_garbled_answer_names_the_parsers_complaint_without_quoting_the_upstream(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: b"HTTP/1.1 200 OK\r\nX-Leak: " + b"s" * 9000 + b"\r\n\r\n")
    pool = Pool()
    with pytest.raises(MalformedAnswer) as caught:
        await pool.request("POST", server.url + "/", {}, b"", 5.0)
    assert failure_of(caught.value) == ("reset", "upstream sent a malformed answer: LineTooLong")
    pool.close()


async def test_a_hosts_addresses_are_kept_and_asked_again_after_a_failed_connect(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b"{}"))
    loop = asyncio.get_running_loop()
    asked: list[str] = []
    port = [server.port]

    async def resolve(host, p, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port[0]))]

    monkeypatch.setattr(loop, "getaddrinfo", resolve)
    now = [100.0]
    pool = Pool(clock=lambda: now[0])
    url = f"http://named.test:{server.port}/"
    first = await pool.request("POST", url, {}, b"", 5.0)
    second = await pool.request("POST", url, {}, b"", 5.0)  # a second connection, the same addresses
    for answer in (first, second):
        await answer.content.read()
        pool.release(answer)
    assert asked == ["named.test"] and server.connections == 2
    pool.close()
    pool = Pool(clock=lambda: now[0])
    with socket.socket() as s:  # the host's address now refuses: the next connect asks again
        s.bind(("127.0.0.1", 0))
        port[0] = s.getsockname()[1]
    with pytest.raises(ConnectFailed):
        await pool.request("POST", url, {}, b"", 5.0)
    port[0] = server.port
    assert await whole(pool, url) == (200, b"{}")
    assert asked == ["named.test", "named.test", "named.test"]
    now[0] += 20.0  # past keep-alive: a new connection, to the addresses still known
    await whole(pool, url)
    assert asked == ["named.test"] * 3
    now[0] += 300.0  # past the addresses' time to live too: asked again
    await whole(pool, url)
    assert asked == ["named.test"] * 4
    pool.close()


async def _first_answered_then(then: bytes) -> tuple[asyncio.Server, list[int], str]:
    """A server answering the first request of each connection; on the second it writes ``then``
    and closes (b"": closes at once, as a keep-alive that ran out as the request crossed it)."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(0)
        try:
            for n in range(2):
                head, length = await read_head(reader)
                await reader.readexactly(length)
                if n == 0:
                    writer.write(reply(b"{}"))
                else:
                    writer.write(then)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, served, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"


async def test_a_reused_connection_closed_as_the_request_crossed_it_is_tried_once_more_on_a_new_one() -> None:
    server, connections, url = await _first_answered_then(b"")
    pool = Pool()
    try:
        assert await whole(pool, url) == (200, b"{}")
        assert await reused(pool, url) == (200, b"{}")  # not a reset: the target did nothing wrong
        assert len(connections) == 2
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_a_reused_connection_that_began_answering_is_not_tried_again() -> None:
    server, connections, url = await _first_answered_then(b"HTTP/1.1 200 OK\r\nContent-Le")
    pool = Pool()
    try:
        assert await whole(pool, url) == (200, b"{}")
        await asyncio.sleep(QUIET)
        with pytest.raises(aiohttp.ServerDisconnectedError):  # it heard the request: a real failure
            await pool.request("POST", url, {}, b"", 5.0)
        assert len(connections) == 1
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_http1_does_not_send_a_request_again_that_the_upstream_was_processing() -> None:
    """The retry is meant for a keep-alive that ran out as the request crossed it. An upstream that
    read the request, worked on it (an LLM call: paid tokens) and then dropped the connection
    without a byte (a crash, a proxy's idle cut) also 'sent nothing back': the pool sends the
    whole POST a second time. Go's net/http, urllib3 and aiohttp replay only what was never
    written or is idempotent; firstbyte must not pay twice for one call."""
    from proxy.upstream.http1 import QUIET, Pool


    processed: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, length = await read_head(reader)
                body = await reader.readexactly(length)
                processed.append(body)
                if len(processed) == 1:
                    writer.write(reply(b"{}"))
                    await writer.drain()
                    continue
                await asyncio.sleep(0.3)  # it works on the request... then dies without a word
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    pool = Pool()
    try:
        answer = await pool.request("POST", url, {}, b'{"n":1}', 5.0)
        await answer.content.read()
        pool.release(answer)
        await asyncio.sleep(QUIET)  # quiet long enough to be reused
        with pytest.raises(Exception):  # noqa: B017 - any failure: the point is how many calls were made
            await asyncio.wait_for(pool.request("POST", url, {}, b'{"n":2}', 5.0), 5)
        second = processed.count(b'{"n":2}')
        assert second == 1, f"the upstream processed one call {second} times"
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
