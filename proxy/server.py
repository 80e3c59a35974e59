"""The HTTP face: the routed handlers, client keys, and the app that ties the endpoints together.

A routed request goes parse -> plan() -> walk() -> relay, then the finished
exchange goes to the observers. Every error a client sees has the OpenAI shape;
every routed response carries ``x-route-decision``.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from .config import Config
from .errors import ClientError, error_body
from .gateway import Gateway
from .observe import Finished
from .observe.hub import Hub
from .ops import add_ops_routes, explain, health, models
from .providers.anthropic_reverse import openai_error_to_anthropic
from .relay import forward_headers, relay_stream
from .replies import GATEWAY, JSON, error_response, new_id
from .request import check_model, estimate_tokens, parse_call, read_body
from .routing.decision import HEADER, Decision, header_with
from .routing.plan import Ask, plan
from .usage import priced, usage_of_body

log = logging.getLogger("firstbyte")

class Exchange:
    """Book-keeping of one routed request, turned into a Finished record at the end."""

    __slots__ = ("decision", "error", "first_sent", "op", "sent", "started", "status", "stream",
                 "t0")

    def __init__(self, op: str, t0: float) -> None:
        self.op = op
        self.t0 = t0
        self.started = time.time()
        self.decision: Decision | None = None
        self.status = 500
        self.stream = False
        self.sent = 0
        self.first_sent: float | None = None
        self.error: str | None = None


async def routed(gw: Gateway, request: web.Request, op: str) -> web.StreamResponse:
    config = gw.config  # this request finishes on the config it started with
    ex = Exchange(op, gw.clock())
    try:
        return await _route(request, gw, config, ex)
    except ClientError as exc:
        decision = getattr(exc, "decision", None)
        ex.decision = decision.but(status=exc.status) if decision is not None else None
        ex.status = exc.status
        response = error_response(exc.status, exc.body(), ex.decision, new_id())
        if exc.close_connection:
            response.force_close()
        return response
    finally:
        end = gw.clock()
        gw.finished(  # positional: this runs for every request (the field order is Finished's)
            Finished(ex.decision, ex.started, request.remote or "-", request.method, request.path, ex.status,
                     op, ex.stream, None if ex.first_sent is None else ex.first_sent - ex.t0, end - ex.t0,
                     ex.sent, ex.error)
        )


async def _route(request: web.Request, gw: Gateway, config: Config, ex: Exchange) -> web.StreamResponse:
    raw = await read_body(request, config.max_body_bytes)
    call, model = parse_call(ex.op, raw, request.headers.get("anthropic-beta"))
    if model not in config.routes:
        check_model(model)  # it becomes the decision's route field: nothing that breaks the grammar
    ex.stream = call.stream
    tokens = estimate_tokens(call) if model in gw.sized_routes else None
    ask = Ask(new_id(), model, request.headers.get("x-route-provider"), tokens, op=ex.op)
    planned = plan(config, ask, gw.state, gw.clock(), gw.rng(model))
    decision = planned.decision
    if not planned.targets:
        decision = decision.but(status=503)
        ex.decision, ex.status = decision, 503
        why = ", ".join(f"{e.name} ({e.reason})" for e in decision.excluded) or "no targets"
        body = error_body(
            f"No target of route '{decision.route}' can serve this request now: {why}.",
            "service_unavailable",
            code="no_eligible_target",
        )
        return error_response(503, body, decision)

    assert gw.walker is not None
    result = await gw.walker.walk(config, planned.route, planned.targets, call, rescued=planned.rescued)
    served = result.attempts[-1].name if result.lease is not None or 200 <= result.status < 300 else None
    lease = result.lease
    if lease is not None:
        # A stream: its usage is known only at the end, so its record is built once, then; the
        # header goes out now, formatted from the same fields.
        attempts = tuple(result.attempts)
        header = header_with(decision, attempts, served)
        ex.status = result.status
        headers = forward_headers(result.headers, {HEADER: header, "x-request-id": decision.id})
        try:
            return await relay_stream(request, lease, result.status, headers, gw.clock, ex)
        finally:  # even when the client left early
            ex.decision = priced(decision, lease.target.price, getattr(lease.translator, "usage", None),
                                 attempts=attempts, served=served, status=result.status, _header=header)
    if served is not None:
        # A buffered answer: its usage is known now, so the record is built once, priced.
        target = planned.route.target(served)
        decision = priced(decision, target.price if target is not None else None,
                          usage_of_body(call.op, result.body),
                          attempts=tuple(result.attempts), served=served, status=result.status)
    else:
        decision = decision.but(attempts=tuple(result.attempts), served=served, status=result.status)
    ex.decision, ex.status = decision, result.status
    extra = {HEADER: decision.header(), "x-request-id": decision.id}
    if served is not None or (result.outcome is not None and not result.outcome.failover):
        # A buffered answer, or another 4xx returned to the client as it is.
        headers = forward_headers(result.headers, extra)
        response = web.Response(body=result.body, status=result.status, headers=headers)
        ex.sent, ex.first_sent = len(result.body), gw.clock()
        return response
    # Everything failed: the last error, in the OpenAI shape.
    ex.sent, ex.first_sent = len(result.body), gw.clock()
    return error_response(result.status, result.body, decision)


def messages(gw: Gateway) -> Handler:
    """Anthropic's Messages API for clients that speak it: routed like any request, and every
    error it answers (firstbyte's own 400/404/503 included) in Anthropic's error shape."""

    async def handle_messages(request: web.Request) -> web.StreamResponse:
        response = await routed(gw, request, "messages")
        if response.status >= 400 and isinstance(response, web.Response) and isinstance(response.body, bytes):
            response.body = openai_error_to_anthropic(response.status, response.body)
        return response

    return handle_messages


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guarded(gw: Gateway, inner: Handler, *, anthropic: bool = False) -> Handler:
    """An endpoint under /v1: client keys first, and whatever escapes it in the OpenAI shape.

    This wraps each handler instead of being aiohttp middleware: two middlewares
    cost about 2.5 % of a relayed call (callgrind), for checks that need no
    chain. ``anthropic`` answers a refused key in Anthropic's error shape.
    """

    async def handle(request: web.Request) -> web.StreamResponse:
        keys = gw.config.clients.keys
        if keys and not _key_accepted(request, keys):
            return _key_refused(anthropic)
        try:
            return await inner(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _refusal(request, exc.status, exc.reason, exc.headers.get("Allow"))
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            body = error_body("firstbyte failed to handle this request; the error is in its log.",
                              "server_error", code="internal_error")
            return web.Response(body=body, status=500, content_type=JSON)

    handle.__name__ = f"guarded_{getattr(inner, '__name__', 'handler')}"
    return handle


def handler(gw: Gateway, op: str) -> Handler:
    """A routed endpoint for one operation."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await routed(gw, request, op)

    handle.__name__ = f"handle_{op}"
    return handle


def _presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _key_accepted(request: web.Request, keys: Iterable[str]) -> bool:
    # aiohttp decodes header bytes that are not UTF-8 with surrogates: encode them back, not fail.
    presented = (_presented_key(request) or "").encode("utf-8", "surrogateescape")
    ok = False
    for key in keys:  # compare against every key: the time says nothing about which matched
        ok |= hmac.compare_digest(presented, key.encode())
    return ok


def _key_refused(anthropic: bool) -> web.Response:
    body = error_body(
        "Missing or unknown client key: send 'Authorization: Bearer <key>' "
        "with a key this gateway was given.",
        "authentication_error",
        code="invalid_api_key",
    )
    if anthropic:
        body = openai_error_to_anthropic(401, body)
    return error_response(401, body, request_id=new_id())


def _refusal(request: web.Request, status: int, reason: str, allow: str | None = None) -> web.Response:
    message = f"{reason}: {request.method} {request.path}"
    if status == 404:
        message += " is not an endpoint of this gateway (see /v1/models, /v1/chat/completions)."
    body = error_body(message, "invalid_request_error", code=f"http_{status}")
    return web.Response(body=body, status=status, content_type=JSON,
                        headers={"Allow": allow} if allow else None)


def no_endpoint(gw: Gateway, known: dict[str, set[str]]) -> Handler:
    """The catch-all route: an unknown path is a 404 and a known path with another method a 405,
    both in the OpenAI shape (and behind client keys under /v1, like every endpoint there)."""

    async def refuse(request: web.Request) -> web.StreamResponse:
        methods = known.get(request.path)
        if methods is None:
            return _refusal(request, 404, "Not Found")
        return _refusal(request, 405, "Method Not Allowed", ",".join(sorted(methods)))

    guarded_refuse = guarded(gw, refuse)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            return await guarded_refuse(request)
        return await refuse(request)

    return handle


def build_app(gw: Gateway, hub: Hub | None = None, *, manage: bool = True) -> web.Application:
    """The main app. ``manage=False`` when the caller starts and closes the gateway itself."""
    app = web.Application(client_max_size=1 << 40)
    app[GATEWAY] = gw
    add_ops_routes(app, hub)
    endpoints: list[tuple[str, str, Handler]] = [
        ("POST", "/v1/chat/completions", handler(gw, "chat")),
        ("POST", "/v1/completions", handler(gw, "completions")),
        ("POST", "/v1/embeddings", handler(gw, "embeddings")),
        ("POST", "/v1/messages", messages(gw)),
        ("GET", "/v1/models", models),
        ("GET", "/v1/health", health),
    ]
    for method, path, inner in endpoints:
        app.router.add_route(method, path, guarded(gw, inner, anthropic=path == "/v1/messages"))
    app.router.add_get("/v1/routes/{route}/explain", guarded(gw, explain))
    known: dict[str, set[str]] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        known.setdefault(path, set()).add(route.method)
    app.router.add_route("*", "/{tail:.*}", no_endpoint(gw, known))

    async def lifecycle(app: web.Application) -> Any:
        await gw.start()
        yield
        await gw.close()

    if manage:
        app.cleanup_ctx.append(lifecycle)
    return app
