"""Client keys (``clients.keys_env``): who may call the main listener's keyed endpoints.

Every ``/v1`` endpoint (``app.guarded``) and, with keys set, ``/metrics`` ask for one; ``/readyz``
tells more to a caller that holds one. The ops listener asks for none (README "Security").
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from aiohttp import web

from .dialect import Dialect, error_bytes
from .replies import error_response

__all__ = ["key_accepted", "key_refused", "presented_key"]


def presented_key(request: web.Request) -> str | None:
    """``Authorization: Bearer <key>`` (OpenAI's clients), else ``x-api-key`` (Anthropic's)."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def key_accepted(request: web.Request, keys: Iterable[str]) -> bool:
    """Does the request hold one of ``keys``? Compared in constant time, against every key."""
    # aiohttp decodes header bytes that are not UTF-8 with surrogates: encode them back, not fail.
    presented = (presented_key(request) or "").encode("utf-8", "surrogateescape")
    ok = False
    for key in keys:  # compare against every key: the time says nothing about which matched
        ok |= hmac.compare_digest(presented, key.encode())
    return ok


def key_refused(dialect: Dialect, rid: str) -> web.Response:
    """The 401 a request without an accepted key gets, in its endpoint's dialect."""
    body = error_bytes(
        dialect,
        401,
        "Missing or unknown client key: send 'Authorization: Bearer <key>' "
        "with a key this gateway was given.",
        "authentication_error",
        code="invalid_api_key",
    )
    return error_response(401, body, request_id=rid)
