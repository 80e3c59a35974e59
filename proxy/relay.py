"""relay: send a committed answer to the client, chunk by chunk, as it arrives.

``StreamResponse.prepare()`` is the commit point on the client side: headers
(with ``x-route-decision``) go out, and from then on a failure can only end the
stream with an error event. Writes wait for the client (backpressure), so a
slow reader holds the upstream back instead of filling our memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from .walk import Lease

# Never forwarded from upstream: hop-by-hop, framing we redo, and credentials.
DROPPED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "date",
        "server",
        "set-cookie",
        "set-cookie2",
        "authorization",
        "www-authenticate",
        "x-api-key",
        "api-key",
        "openai-organization",
        "openai-project",
        "anthropic-organization-id",
    }
)


def forward_headers(upstream: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    headers = {k: v for k, v in upstream.items() if k.lower() not in DROPPED}
    headers.update(extra)
    return headers


class _CommitResponse(web.StreamResponse):
    """A StreamResponse whose headers leave with the first chunk, in one write.

    ``prepare()`` is still the commit point; since the relay only prepares once
    it holds the first chunk, holding the headers back for that write costs no
    time and saves the client a separate segment on its first-chunk path.
    """

    _send_headers_immediately = False  # aiohttp's own switch (web.Response uses it too)


@dataclass(slots=True)
class Relayed:
    response: web.StreamResponse
    bytes_sent: int
    first_sent: float | None
    error: str | None  # why the stream ended early, if it did
    client_gone: bool


def _error_event(message: str, code: str) -> bytes:
    err = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + orjson.dumps(err) + b"\n\n"


async def relay_stream(
    request: web.Request,
    lease: Lease,
    status: int,
    headers: Mapping[str, str],
    clock: Callable[[], float],
) -> Relayed:
    response = _CommitResponse(status=status, headers=headers)
    sent = 0
    first_sent: float | None = None
    error: str | None = None
    translator = lease.translator
    try:
        await response.prepare(request)
        data = lease.first
        while True:
            if translator is not None:
                data = translator.feed(data)
            if data:
                await response.write(data)
                if not sent:
                    first_sent = clock()
                sent += len(data)
            try:
                data = await lease.chunk()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                error = _describe(exc)
                break
            except Exception as exc:  # a translator's verdict on a broken stream
                error = f"{type(exc).__name__}: {exc}"
                break
            if not data:
                break
        if error is not None:
            event = _error_event(
                f"{lease.target.name}: the upstream stream failed after it started ({error}); "
                "the answer is incomplete.",
                "stream_interrupted",
            )
            await response.write(event)
            sent += len(event)
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        lease.finish(None)  # the client left: nothing to say about the provider
        return Relayed(response, sent, first_sent, "client disconnected", True)
    finally:
        lease.finish(error)
    return Relayed(response, sent, first_sent, error, False)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "idle timeout"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "stream cut"
    return type(exc).__name__
