"""The upstream client on aiohttp's public API: ``ClientSession``, for an aiohttp whose internals moved.

``http1.Pool`` drives aiohttp's client protocol directly (docs/adr/0011). When the start-up check
(``proxy/internals.py``) finds those internals missing or misbehaving, upstream calls go through this
pool instead: the same surface (``request``, ``release``, ``close``), the same rules (no cookies, no
redirects, no User-Agent, no proxy from the environment, gzip and deflate, TLS against the system's CA
store, addresses kept 300 s, idle connections closed after 15 s), the same failure words (``refused``,
``dns``, ``tls``, a malformed answer, a status never passed on), at about 100 µs more CPU per call.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import NamedTuple

import aiohttp
from multidict import CIMultiDictProxy

from ..internals import Internals
from .http1 import (
    DNS_TTL,
    HAPPY_EYEBALLS,
    KEEPALIVE,
    READ_BUFSIZE,
    Answer,
    BadStatus,
    ConnectFailed,
    MalformedAnswer,
    Pool,
    default_tls,
    relayable,
)


class SessionAnswer(NamedTuple):
    status: int
    headers: CIMultiDictProxy[str]
    content: aiohttp.StreamReader
    response: aiohttp.ClientResponse


class SessionPool:
    """Upstream calls over one ``aiohttp.ClientSession``; made inside the running loop."""

    def __init__(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=int(DNS_TTL), keepalive_timeout=KEEPALIVE,
                                         ssl=default_tls(), happy_eyeballs_delay=HAPPY_EYEBALLS)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=True,
            read_bufsize=READ_BUFSIZE, trust_env=False, skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(total=None),  # first chunk, idle and total: the walk's sweeper
        )

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes,
                      connect_timeout: float | None) -> SessionAnswer:
        """Send one request; return once the status and headers are in, failures in http1's words."""
        try:
            response = await self._session.request(
                method, url, headers=headers, data=body, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
            )
        except aiohttp.ClientSSLError as exc:
            raise ConnectFailed("tls", f"TLS failure talking to upstream: {exc}") from exc
        except aiohttp.ClientConnectorError as exc:
            host, port = exc.host, exc.port
            if isinstance(exc.os_error, socket.gaierror):
                raise ConnectFailed("dns", f"cannot resolve upstream host {host}: {exc.os_error}") from exc
            raise ConnectFailed("refused", f"cannot connect to upstream {host}:{port}: {exc.os_error}") from exc
        except aiohttp.ClientResponseError as exc:  # the answer's head did not parse
            raise MalformedAnswer(type(exc.__cause__ or exc).__name__) from exc
        if not relayable(response.status):  # a 101, a redirect or a number HTTP does not define, as http1.Pool
            response.close()
            raise BadStatus(response.status)
        return SessionAnswer(response.status, response.headers, response.content, response)

    def release(self, answer: SessionAnswer) -> None:
        """Give the connection back when the answer was read to its end, else close it."""
        if answer.content.at_eof():
            answer.response.release()
        else:
            answer.response.close()

    async def close(self) -> None:
        await self._session.close()


UpstreamPool = Pool | SessionPool
UpstreamAnswer = Answer | SessionAnswer


def upstream_pool(internals: Internals) -> UpstreamPool:
    """firstbyte's own pool when aiohttp's client protocol behaves, else aiohttp's public client."""
    return SessionPool() if internals.client else Pool()


async def close_pool(pool: UpstreamPool) -> None:
    """``Pool.close`` is synchronous, the session's is not."""
    if isinstance(pool, SessionPool):
        await pool.close()
    else:
        pool.close()
