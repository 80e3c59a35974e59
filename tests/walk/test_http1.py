"""The upstream HTTP/1.1 client against real sockets on loopback.

Each server here is a plain asyncio server that reads request heads by hand and
answers with scripted bytes, so the test sees exactly what went over the wire:
how many connections were opened, what the request head said, when the client
closed its end.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from proxy.walk.http1 import ConnectFailed, MalformedAnswer, Origin, Pool, _endpoint, request_head
from proxy.walk.transport import failure_of

Answer = Callable[[bytes], bytes | None]  # request bytes -> answer bytes (None: say nothing)


def reply(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


class Server:
    """Counts connections, keeps each request it read, answers by ``answer`` and notices closes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.closed = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.url = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        self.tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.answer(request)
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()

    async def start(self) -> Server:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def stop(self) -> None:
        for writer in self.writers:
            writer.close()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(answer: Answer) -> Server:
        server = await Server(answer).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


async def whole(pool: Pool, url: str, body: bytes = b"{}", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    answer = await pool.request("POST", url, headers or {}, body, 5.0)
    try:
        return answer.status, await answer.content.read()
    finally:
        pool.release(answer)


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


async def test_a_connection_read_to_its_end_is_reused(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(lambda _: reply(b'{"ok":1}', "Content-Type: application/json"))
    pool = Pool()
    for _ in range(3):
        assert await whole(pool, server.url + "/v1/x", b'{"a":1}', {"authorization": "Bearer k"}) == (200, b'{"ok":1}')
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
    assert await whole(pool, server.url + "/") == (200, b"data: hello\n\n" * 50)
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
    with pytest.raises(MalformedAnswer, match="Bad status line") as caught:
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
