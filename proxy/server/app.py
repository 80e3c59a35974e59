"""The HTTP face: the routed handlers, client keys, and the app that ties the endpoints together.

A routed request goes parse -> plan() -> walk() -> relay, then the finished
exchange goes to the observers. Every error is built in the OpenAI shape and
answered in the endpoint's dialect (``dialect.py``); every routed response carries
``x-route-decision``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..config import Config, Route
from ..egress import forward_headers
from ..errors import ClientError, error_body
from ..gateway import Gateway
from ..observe import Finished
from ..observe.hub import Hub
from ..relay import relay_stream
from ..routing.cost import priced
from ..routing.decision import HEADER, Attempt, Decision, Racer, header_with
from ..routing.plan import Ask, Refused, plan
from ..state.tracker import BUFFERED, STREAMED
from ..traceparent import TraceContext, begin
from ..translate.usage import usage_of_body
from ..walk.race import walk_route
from ..walk.result import Answered, Committed, Exhausted, Rejected, Settling
from .counting import count_tokens
from .dialect import ANTHROPIC, OPENAI, Dialect, dialect_of, error_bytes, reshaped
from .keys import key_accepted, key_refused
from .listener import ON_REFUSED
from .ops import explain, health, healthz, metrics, model, models, ready
from .replies import GATEWAY, HUB, JSON, answer_every_path, error_response, log_answer, refusals_logged, request_id
from .request import check_model, estimate_tokens, parse_call, pin_of, read_body
from .status import add_status_routes

CLIENT_CLOSED = 499  # logged, never sent: the client closed the request before its answer started

log = logging.getLogger("firstbyte")

class Exchange:
    """Book-keeping of one routed request, turned into a Finished record at the end."""

    __slots__ = ("asked", "decision", "error", "first_sent", "op", "rid", "sent", "settling", "started",
                 "status", "stream", "t0", "trace")

    def __init__(self, op: str, t0: float) -> None:
        self.op = op
        self.t0 = t0
        self.rid = ""
        self.asked: str | None = None
        self.started = time.time()
        self.decision: Decision | None = None
        self.status = 500
        self.stream = False
        self.sent = 0
        self.first_sent: float | None = None
        self.error: str | None = None
        self.settling: Settling | None = None  # losers still being measured after the answer
        self.trace: TraceContext | None = None  # tracing on: this request's trace ids

    def left(self, attempts: tuple[Attempt, ...], race: tuple[Racer, ...]) -> None:
        """The client left while a race ran and nothing had answered: log what had run."""
        if self.decision is not None:
            self.decision = self.decision.as_tried(race).but(attempts=attempts, race=race)


async def routed(gw: Gateway, request: web.Request, op: str) -> web.StreamResponse:
    config = gw.config  # this request finishes on the config it started with
    ex = Exchange(op, gw.clock())
    ex.rid = request_id(request)
    try:
        response = await _route(request, gw, config, ex)
        if op == "messages" and response.status >= 400:
            response = _in_anthropic_shape(response, ex)
        return response
    except ClientError as exc:
        decision = exc.decision if isinstance(exc, Refused) else None  # routing refused it, with why
        ex.decision = decision.but(status=exc.status) if decision is not None else None
        ex.status = exc.status
        ex.error = exc.code or exc.type
        body = exc.body()
        ex.sent = len(body)
        response = error_response(exc.status, body, ex.decision, ex.rid)
        if exc.close_connection:
            response.force_close()
        return _in_anthropic_shape(response, ex) if op == "messages" else response
    except asyncio.CancelledError:
        if ex.status == 500 and ex.error is None:  # nothing was answered yet
            # The client left before an answer started (nginx's 499), or a drain's grace ran out.
            ex.status, ex.error = (503, "draining") if gw.draining else (CLIENT_CLOSED, "client_closed_request")
            if ex.decision is not None:
                ex.decision = ex.decision.but(status=ex.status)
        raise
    finally:
        end = gw.clock()
        finished = Finished(  # positional: this runs for every request (the field order is Finished's)
            ex.decision, ex.started, request.remote or "-", request.method, request.path, ex.status,
            op, ex.stream, None if ex.first_sent is None else ex.first_sent - ex.t0, end - ex.t0,
            ex.sent, ex.error, ex.rid, ex.asked, ex.trace)
        if ex.settling is None:
            gw.outbox.finished(finished)
        else:
            gw.outbox.finished_when_settled(finished, ex.settling)


def _in_anthropic_shape(response: web.StreamResponse, ex: Exchange) -> web.StreamResponse:
    """A ``/v1/messages`` error, reshaped here rather than by ``guarded`` (which passes an
    Anthropic-shape error as it is), so the exchange logs the size the client was sent."""
    response = reshaped(ANTHROPIC, response)
    if isinstance(response, web.Response) and isinstance(response.body, bytes):
        ex.sent = len(response.body)
    return response


async def _route(request: web.Request, gw: Gateway, config: Config, ex: Exchange) -> web.StreamResponse:
    raw = await read_body(request, config.max_body_bytes)
    call, model = parse_call(ex.op, raw, request.headers.get("anthropic-beta"))
    if model not in config.routes:
        check_model(model)  # it becomes the decision's route field: nothing that breaks the grammar
    ex.stream = call.stream
    ex.asked = model
    if config.tracing is not None:  # ids and a traceparent per attempt; the spans are built afterwards
        call.trace = ex.trace = begin(request.headers, config.tracing.sample, ex.t0)
    tokens = estimate_tokens(call) if model in gw.sized_routes else None
    ask = Ask(ex.rid, model, pin_of(request), tokens, ex.op,
              STREAMED if call.stream else BUFFERED)
    planned = plan(config, ask, gw.state, gw.clock(), gw.rng(model))
    if gw.fleet is not None:  # the routes with traffic keep their measuring claims (fleet/measures.py)
        gw.fleet.asked(model, ask.mode)
    decision = ex.decision = planned.decision  # what is logged if the client leaves during the walk
    if not planned.targets:
        return _nothing_eligible(ex, decision, planned.unservable)
    call.meanwhile = decision.planned_fields  # formatted while the upstream thinks, not after its first token

    assert gw.walker is not None
    walked = await walk_route(gw.walker, config.providers, planned, call, ex.left)
    if walked.race:
        decision = decision.as_tried(walked.race)
    if not isinstance(walked, Committed):
        return _reply(gw, ex, decision, planned.route, call.op, walked)
    # A stream, relayed here rather than in a coroutine of its own (one frame fewer in the await
    # chain of every chunk): its usage is known only at the end, so its record is built once,
    # then; the header goes out now, formatted from the same fields.
    attempts, served, race, lease = walked.attempts, walked.served, walked.race, walked.lease
    ex.settling = walked.settling
    header = header_with(decision, attempts, served, race)
    ex.status = walked.status
    headers = {**walked.headers, HEADER: header, "x-request-id": decision.id}  # sorted at the upstream's head
    try:
        return await relay_stream(request, lease, walked.status, headers, gw.clock, ex, gw.scrubber)
    finally:  # even when the client left early
        ex.decision = priced(decision, lease.target.price, lease.translator.usage, attempts=attempts,
                             served=served, status=walked.status, race=race, _header=header)


def _reply(gw: Gateway, ex: Exchange, decision: Decision, route: Route, op: str,
           walked: Answered | Rejected | Exhausted) -> web.Response:
    """A buffered answer (its usage known now, so its record is built once, priced), a client
    error returned as it is, or, when everything failed, the last error in the OpenAI shape."""
    if isinstance(walked, Answered):
        ex.settling = walked.settling
        target = route.target(walked.served)
        decision = priced(decision, target.price if target is not None else None, usage_of_body(op, walked.body),
                          attempts=walked.attempts, served=walked.served, status=walked.status, race=walked.race)
    else:
        decision = decision.but(attempts=walked.attempts, served=None, status=walked.status, race=walked.race)
        if walked.word is not None:
            ex.error = walked.word  # the walk's verdict: 429, timeout, untranslatable…
    ex.decision, ex.status = decision, walked.status
    ex.sent, ex.first_sent = len(walked.body), gw.clock()
    if isinstance(walked, Exhausted):
        return error_response(walked.status, walked.body, decision)
    headers = forward_headers(walked.headers, {HEADER: decision.header(), "x-request-id": decision.id},
                              gw.scrubber)
    return web.Response(body=walked.body, status=walked.status, headers=headers)


def _nothing_eligible(ex: Exchange, decision: Decision, unservable: str | None) -> web.Response:
    """503 when health or credentials emptied the route (it may recover); 400 when only the
    request's own size or the route's floors did, since retrying can never succeed."""
    status = 400 if unservable is not None else 503
    decision = decision.but(status=status)
    ex.decision, ex.status = decision, status
    why = ", ".join(f"{e.name} ({e.reason})" for e in decision.excluded) or "no targets"
    if unservable is None:
        body = error_body(f"No target of route '{decision.route}' can serve this request now: {why}.",
                          "service_unavailable", code="no_eligible_target")
    elif unservable == "context_length_exceeded":
        body = error_body(f"This request is too large for every target of route '{decision.route}': {why}. "
                          "Shorten the messages or lower max_tokens.",
                          "invalid_request_error", code=unservable, param="messages")
    else:
        body = error_body(f"No target of route '{decision.route}' meets its {unservable} floor: {why}. "
                          "Declare the targets' values or lower the floor in the config.",
                          "invalid_request_error", code=unservable)
    ex.error = unservable or "no_eligible_target"
    ex.sent = len(body)
    return error_response(status, body, decision)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guarded(gw: Gateway, inner: Handler, *, dialect: Dialect | None = OPENAI, logs: bool = False) -> Handler:
    """An endpoint under /v1: client keys first, and every error it answers in its ``dialect``
    (``None``: the request's, for the catch-all), whatever raised or built it.

    This wraps each handler instead of being aiohttp middleware: two middlewares
    cost about 2.5 % of a relayed call (callgrind), for checks that need no
    chain. A refused key is logged here; ``logs`` logs every answer of an
    endpoint that is not routed (routed ones log their own, with the decision).
    """

    async def handle(request: web.Request) -> web.StreamResponse:
        speaks = dialect_of(request) if dialect is None else dialect
        keys = gw.config.clients.keys
        if keys and not key_accepted(request, keys):
            t0 = gw.clock()
            refused = key_refused(speaks, request_id(request))
            log_answer(gw, request, refused, t0)
            return refused
        t0 = gw.clock() if logs else 0.0
        try:  # inline, not a helper coroutine: this wraps every routed call
            response = await inner(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = _refusal(request, exc.status, exc.reason, exc.headers.get("Allow"))
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            body = error_body("firstbyte failed to handle this request; the error is in its log.",
                              "server_error", code="internal_error")
            response = web.Response(body=body, status=500, content_type=JSON,
                                    headers={"x-request-id": request_id(request)})
        response = reshaped(speaks, response)
        if logs:
            log_answer(gw, request, response, t0)
        return response

    handle.__name__ = f"guarded_{getattr(inner, '__name__', 'handler')}"
    return handle


def handler(gw: Gateway, op: str) -> Handler:
    """A routed endpoint for one operation: ``routed`` itself with the operation bound, not a
    coroutine around it, whose frame every resume of the request's task would pass through."""
    return functools.partial(routed, gw, op=op)


SERVED = "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages, /v1/models"
# OpenAI API families a client may call that are not routed here: a 404 that says so.
_UNSERVED = {
    "images": "image generation", "audio": "audio (speech, transcription)", "moderations": "moderations",
    "files": "files", "batches": "batches", "uploads": "uploads", "fine_tuning": "fine-tuning",
    "vector_stores": "vector stores", "assistants": "assistants", "threads": "threads", "realtime": "realtime",
    "containers": "containers", "conversations": "conversations", "evals": "evals", "videos": "videos",
}


def _refusal(request: web.Request, status: int, reason: str, allow: str | None = None) -> web.Response:
    """404/405 in the dialect of the endpoint family (``dialect_of``)."""
    path = request.path
    family = path[4:].split("/", 1)[0] if path.startswith("/v1/") else ""
    code = f"http_{status}"
    message = f"{reason}: {request.method} {path}"
    if status == 404 and family in _UNSERVED:
        message = (f"This gateway does not serve the {_UNSERVED[family]} API ({request.method} {path}); "
                   f"it routes {SERVED}. Call a provider directly for {family}.")
        code = "unsupported_endpoint"
    elif status == 404:
        message += f" is not an endpoint of this gateway (it serves {SERVED})."
    body = error_bytes(dialect_of(request), status, message, "invalid_request_error", code=code)
    headers = {"x-request-id": request_id(request)}
    if allow:
        headers["Allow"] = allow
    return web.Response(body=body, status=status, content_type=JSON, headers=headers)


def no_endpoint(gw: Gateway, known: dict[str, set[str]]) -> Handler:
    """The catch-all route: an unknown path is a 404 and a known path with another method a 405,
    both in the endpoint family's error shape (and behind client keys under /v1, like every
    endpoint there), each with its access-log line."""

    async def refuse(request: web.Request) -> web.StreamResponse:
        methods = known.get(request.path)
        if methods is None:
            return _refusal(request, 404, "Not Found")
        return _refusal(request, 405, "Method Not Allowed", ",".join(sorted(methods)))

    guarded_refuse = guarded(gw, refuse, dialect=None, logs=True)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            return await guarded_refuse(request)
        t0 = gw.clock()
        response = await refuse(request)
        log_answer(gw, request, response, t0)
        return response

    return handle


def add_probes(app: web.Application, gw: Gateway, hub: Hub | None) -> None:
    """The main listener's probes. With client keys set (README "Security"): ``/healthz`` stays open,
    ``/readyz`` too but says only its status to a caller without a key (a load balancer sends none),
    and ``/metrics`` (route and target names, costs) needs a key like ``/v1``; the ops listener
    serves all three without keys."""

    async def readyz(request: web.Request) -> web.StreamResponse:
        keys = gw.config.clients.keys
        return ready(gw, full=not keys or key_accepted(request, keys))

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if hub is not None:
        app[HUB] = hub
        app.router.add_get("/metrics", guarded(gw, metrics))


def build_app(gw: Gateway, hub: Hub | None = None, *, manage: bool = True) -> web.Application:
    """The main app. ``manage=False`` when the caller starts and closes the gateway itself."""
    app = web.Application(client_max_size=1 << 40)
    app[GATEWAY] = gw
    app[ON_REFUSED] = refusals_logged(gw)
    add_probes(app, gw, hub)
    if hub is not None:
        add_status_routes(app, main=True)  # the status page, refused while client keys are set
    endpoints: list[tuple[str, str, Handler]] = [
        ("POST", "/v1/chat/completions", handler(gw, "chat")),
        ("POST", "/v1/completions", handler(gw, "completions")),
        ("POST", "/v1/embeddings", handler(gw, "embeddings")),
        ("POST", "/v1/messages", handler(gw, "messages")),
        ("POST", "/v1/responses", handler(gw, "responses")),
        ("GET", "/v1/models", models),
        ("GET", "/v1/health", health),
    ]
    for method, path, inner in endpoints:
        app.router.add_route(method, path, guarded(gw, inner, dialect=ANTHROPIC if path == "/v1/messages" else OPENAI,
                                                   logs=method == "GET"))
    app.router.add_post("/v1/messages/count_tokens", guarded(gw, count_tokens(gw), dialect=ANTHROPIC, logs=True))
    app.router.add_get("/v1/models/{model:.+}", guarded(gw, model, logs=True))
    app.router.add_get("/v1/routes/{route}/explain", guarded(gw, explain, logs=True))
    known: dict[str, set[str]] = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        known.setdefault(path, set()).add(route.method)
    answer_every_path(app, no_endpoint(gw, known))

    async def lifecycle(app: web.Application) -> Any:
        await gw.start()
        yield
        await gw.close()

    if manage:
        app.cleanup_ctx.append(lifecycle)
    return app
