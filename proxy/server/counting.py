"""``POST /v1/messages/count_tokens``: Anthropic's token counter, for the clients that call it.

Claude Code and the ``anthropic`` SDK's ``messages.count_tokens`` ask before they
send. The route is planned as a Messages request would be, and the first
Anthropic target in that order answers (the body goes as it is, model swapped);
a failover-safe failure moves on to the next Anthropic target. When the route
has none (or none answered), the answer is an estimate from the text
(characters / 4, the same rule the context-window check uses), marked as one:
``"estimated": true`` in the body and ``x-token-count: estimate``.

This is not routed traffic: no figure, breaker or ledger row is fed by it (a
count is not an answer, and its speed says nothing about the model's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from ..config import Provider, Target
from ..errors import ClientError
from ..gateway import Gateway
from ..providers.anthropic import anthropic_headers
from ..routing.plan import Ask, plan
from ..translate.tokens import estimate_tokens
from ..upstream.transport import BodyTooLarge, HttpUpstream
from ..walk.classify import classify_status
from .dialect import ANTHROPIC, in_dialect
from .replies import JSON, request_id
from .request import parse_call, pin_of, read_body

__all__ = ["count_tokens", "estimate_input_tokens"]

log = logging.getLogger("firstbyte")

MAX_ANSWER = 64 * 1024


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """An estimate of a Messages request's input tokens, the context check's (``translate/tokens.py``),
    at least 1; tool schemas count as input."""
    return max(1, estimate_tokens(body.get("system"), body.get("messages"), body.get("tools")))


def count_tokens(gw: Gateway) -> Any:
    async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
        rid = request_id(request)
        config = gw.config
        try:
            raw = await read_body(request, config.max_body_bytes)
            call, model = parse_call("messages", raw)
            planned = plan(config, Ask(rid, model, pin_of(request), op="messages"),
                           gw.state, gw.clock(), gw.rng(model), explore=False)
        except ClientError as exc:
            return _reply(exc.status, in_dialect(ANTHROPIC, exc.status, exc.body()), rid)
        reasons = []
        for target in planned.targets:
            provider = config.providers[target.provider]
            if provider.kind != "anthropic":
                continue
            answer = await _ask_anthropic(gw, provider, target, call.body, request.headers.get("anthropic-beta"))
            if isinstance(answer, str):
                reasons.append(f"{target.name} ({answer})")
                continue
            status, body = answer
            return _reply(status, body, rid, {"x-token-count": f"anthropic {target.name}"})
        why = "; ".join(reasons) if reasons else "no Anthropic target in the route"
        body = orjson.dumps({"input_tokens": estimate_input_tokens(call.body), "estimated": True})
        return _reply(200, body, rid, {"x-token-count": f"estimate ({why})"[:300]})

    return handle_count_tokens


async def _ask_anthropic(gw: Gateway, provider: Provider, target: Target, body: dict[str, Any],
                         beta: str | None) -> tuple[int, bytes] | str:
    """Anthropic's own count: (status, body) to answer with, or why to move on."""
    pool = gw.pool
    if pool is None:
        return "not started"
    headers = anthropic_headers(provider, beta)
    upstream_body = orjson.dumps({**body, "model": target.model})
    started = time.monotonic()
    try:
        async with asyncio.timeout(provider.timeouts.first_chunk):
            reply = HttpUpstream(await pool.request("POST", provider.base_url + "/messages/count_tokens",
                                                    headers, upstream_body, provider.timeouts.connect), pool)
            try:
                # The whole of it, scrubbed (proxy/scrub.py): an error may come with any status, 200 too.
                answer = gw.scrubber.error_body(await reply.read(MAX_ANSWER))
            finally:
                reply.close()
        status = reply.status
        retry = reply.headers
    except (TimeoutError, aiohttp.ClientError, OSError, BodyTooLarge) as exc:
        return f"{type(exc).__name__} after {time.monotonic() - started:.2f}s"
    if 200 <= status < 300:
        return status, answer
    outcome = classify_status(status, retry, False)
    if not outcome.failover:  # the client's own mistake: Anthropic's error, as it is
        return status, answer
    return outcome.word


def _reply(status: int, body: bytes, rid: str, extra: dict[str, str] | None = None) -> web.Response:
    headers = {"x-request-id": rid, **(extra or {})}
    return web.Response(body=body, status=status, content_type=JSON, headers=headers)
