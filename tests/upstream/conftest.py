"""What the upstream client's tests share (test_http1, test_connection): a raw asyncio HTTP server
that counts connections and answers by a function, and the calls that read its answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.upstream.http1 import QUIET, Pool


def reply(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, int]:
    """A request's head as sent, and the body length it declares."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, length


async def whole(pool: Pool, url: str, body: bytes = b"{}", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    answer = await pool.request("POST", url, headers or {}, body, 5.0)
    try:
        return answer.status, await answer.content.read()
    finally:
        pool.release(answer)


async def reused(pool: Pool, url: str, body: bytes = b"{}") -> tuple[int, bytes]:
    """``whole`` once the last released connection has been quiet long enough to be reused."""
    await asyncio.sleep(QUIET)
    return await whole(pool, url, body)


Answer = Callable[[bytes], bytes | None]  # request bytes -> answer bytes (None: say nothing)


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
                head, length = await read_head(reader)
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
