"""What the upstream client's tests share (test_http1, test_connection): a raw asyncio HTTP server
that counts connections and answers by a function, and the calls that read its answers."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

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


def ca_and_leaf(tmp: Path, dns: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "review ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - day).not_valid_after(now + day)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns)]))
            .issuer_name(ca_name).public_key(leaf_key.public_key()).serial_number(2)
            .not_valid_before(now - day).not_valid_after(now + day)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (tmp / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return tmp / "ca.pem", tmp / "leaf.pem"
