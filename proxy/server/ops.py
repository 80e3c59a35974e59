"""Endpoints for operators and tools: models, liveness, readiness, target health, explain, metrics.

Explain calls the very same ``plan()`` a request gets (without exploring), so it
cannot drift from what traffic sees.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..errors import error_body
from ..gateway import Gateway
from ..observe.hub import Hub
from ..routing.hedge import Opening
from ..routing.ordering import load_fit, load_penalty
from ..routing.plan import Ask, plan
from ..routing.score import SIGNALS, score_targets
from ..state.budget import START
from ..state.snapshot import TargetFigures
from ..state.tracker import MODES, STREAMED
from .listener import ON_REFUSED
from .replies import (
    GATEWAY,
    HUB,
    answer_every_path,
    error_response,
    json_response,
    log_answer,
    refusals_logged,
    request_id,
)


async def models(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    created = int(gw.loaded.at)
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "firstbyte"}
        for name in gw.config.routes
    ]
    return json_response({"object": "list", "data": data})


async def model(request: web.Request) -> web.Response:
    """``GET /v1/models/{id}`` (``client.models.retrieve``): a route, or a ``provider/model`` pin
    to a configured provider; anything else is a 404 naming the routes."""
    gw = request.app[GATEWAY]
    name = request.match_info["model"]
    config = gw.config
    provider, sep, _ = name.partition("/")
    if name in config.routes or (sep and provider in config.providers):
        owner = provider if sep else "firstbyte"
        return json_response({"id": name, "object": "model", "created": int(gw.loaded.at), "owned_by": owner},
                             headers={"x-request-id": request_id(request)})
    known = ", ".join(config.routes) or "none"
    body = error_body(f"No route '{name}' (routes: {known}; or name provider/upstream-model).",
                      "invalid_request_error", code="model_not_found", param="model")
    return error_response(404, body, request_id=request_id(request))


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    return ready(request.app[GATEWAY])


def ready(gw: Gateway, full: bool = True) -> web.Response:
    """200 while the config is loaded and the gateway is not draining (503 then); ``full`` adds the
    config's path and the number of routes, which a keyed main listener tells only key holders."""
    if gw.draining:
        return json_response({"status": "draining"}, status=503)
    if not full:
        return json_response({"status": "ready"})
    return json_response({"status": "ready", "config": gw.config.source, "routes": len(gw.config.routes)})


def _figures(figures: TargetFigures) -> dict[str, Any]:
    """A target's figure, samples and age in each mode (they are separate series)."""
    return {mode: {"figure_s": None if m.figure is None else round(m.figure, 4), "samples": m.samples,
                   "age_s": None if m.age is None else round(m.age, 3)}
            for mode, m in figures.modes.items()}


async def health(request: web.Request) -> web.Response:
    """Every target of every route: figures per mode, breaker, failures, in flight, read from the
    state's snapshot like the metrics scrape."""
    gw = request.app[GATEWAY]
    box = None if gw.box is None else {"worker": gw.box.index, "workers": gw.box.count}
    internals = gw.internals.health() if gw.internals is not None else None  # its internals used, or the fallback
    return json_response({"fleet": _fleet(gw), "box": box, "targets": health_rows(gw), "aiohttp": internals})


def health_rows(gw: Gateway) -> list[dict[str, Any]]:
    """The rows of ``/v1/health``, which the status page shows too: one snapshot, two readers."""
    config = gw.config
    out = []
    for figures in gw.state.snapshot(config, gw.clock()):
        target, h = figures.target, figures.health
        fastest = config.routes[figures.route].fastest
        out.append({
            "route": figures.route,
            "target": target.name,
            "provider": target.provider,
            "model": target.model,
            **_figures(figures),  # streamed: first token; buffered: whole answer
            "breaker": h.state,  # closed | open | half-open (next call probes) | probing
            "seconds_left": round(h.seconds_left, 3),  # open: until the probe may go
            "cooling_s": round(h.cooling, 3),  # a Retry-After cool-down still running
            "failures": h.failures,  # consecutive failover-safe failures
            "in_flight": figures.in_flight,
            # what load-aware fastest multiplies the figure by now (1 when it is off)
            "load_penalty": round(load_penalty(fastest, figures.in_flight), 3),
            # seconds the load fit moves the streamed figure by now (0 when it is off): the planner's
            # own pure function, reading the state as the planner does
            "load_fit_s": round(load_fit(fastest, gw.state, target.key, STREAMED), 4),
            **_fleet_in_flight(gw, target.key),
            "last": last_changes(figures, gw.clock()),
        })
    return out


def last_changes(figures: TargetFigures, now: float) -> dict[str, Any]:
    """Which instance's event last changed the target's figure and its breaker, what it was and
    when (wall clock, UTC): ``by`` names the instance as its access log does (None outside a fleet,
    where there is only this one). ``now`` must be read just before: the wall clock read here turns
    the event's age into a time, and a ``now`` read earlier (explain's, before it planned) moved the
    same event's stamp by as long as the planning took (12 ms once under load)."""
    wall = time.time()
    out: dict[str, Any] = {}
    for part, seen in (("figure", figures.figure_by), ("breaker", figures.breaker_by)):
        if seen is None:
            out[part] = None
            continue
        by, what, at = seen
        stamp = wall - max(0.0, now - at)
        out[part] = {"by": by or None, "what": what,
                     "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1000):03d}Z"}
    return out


def _fleet(gw: Gateway) -> dict[str, Any]:
    """In the fleet or alone, and since when (``off`` without ``state.redis``)."""
    return {"state": "off"} if gw.fleet is None else gw.fleet.status()


def _fleet_in_flight(gw: Gateway, key: Any) -> dict[str, int]:
    """The other instances' calls in flight at the target, as they last said (in a fleet only)."""
    return {} if gw.fleet is None else {"fleet_in_flight": gw.fleet.fleet_in_flight(key)}


def _unknown_route(name: str, routes: Any) -> web.Response:
    known = ", ".join(routes) or "none"
    body = error_body(f"No route '{name}' (routes: {known}).", "invalid_request_error", code="model_not_found")
    return error_response(404, body)


async def explain(request: web.Request) -> web.Response:
    """The order a request would get now, without exploring: the very same plan(). Its answer, like
    every routed one, carries an ``x-request-id``: the plan's decision id, in the access log too."""
    rid = request_id(request)
    response = _explained(request, rid)
    response.headers["x-request-id"] = rid
    return response


def _explained(request: web.Request, rid: str) -> web.Response:
    gw = request.app[GATEWAY]
    name = request.match_info["route"]
    config = gw.config
    if name not in config.routes:
        return _unknown_route(name, config.routes)
    route = config.routes[name]
    rng = random.Random()
    rng.setstate(gw.rng(name).getstate())  # a weighted draw shows what the next request draws
    now = gw.clock()
    op = request.query.get("op", "chat")
    mode = request.query.get("mode", STREAMED)
    if mode not in MODES:
        body = error_body(f"mode must be one of {', '.join(MODES)}, not '{mode}'.", "invalid_request_error",
                          code="invalid_mode", param="mode")
        return error_response(400, body)
    planned = plan(config, Ask(rid, name, op=op, mode=mode), gw.state, now, rng, explore=False)
    d = planned.decision
    signals, basis = _signals(gw, route, planned.targets, now, op, mode)
    taken = {f.target.name: f for f in gw.state.snapshot(config, now) if f.route == name}
    order = []
    for ranked, target in zip(d.order, planned.targets, strict=True):
        figures = _figures(taken[target.name])
        order.append({
            "target": target.name,
            "detail": ranked.detail,
            "figure_s": figures[mode]["figure_s"],  # the mode this order is for
            "samples": figures[mode]["samples"],
            **{m: {k: v for k, v in f.items() if k != "age_s"} for m, f in figures.items()},
            "in_flight": taken[target.name].in_flight,
            "load_penalty": round(load_penalty(route.fastest, taken[target.name].in_flight), 3),
            "load_fit_s": round(load_fit(route.fastest, gw.state, target.key, mode), 4),
            "price": None if target.price is None else target.price.total,
            "quality": target.quality,
            "last": last_changes(taken[target.name], gw.clock()),
            **signals.get(target.name, {}),
        })
    return json_response({
        "route": name, "strategy": route.strategy, "mode": mode,
        "fleet": _fleet(gw),
        **({"box": {"worker": gw.box.index, "workers": gw.box.count}} if gw.box is not None else {}),
        **({"cost_basis": basis} if basis else {}),
        **({"hedge": _hedge(gw, route, planned.opening)} if route.hedge is not None else {}),
        "order": order,
        "excluded": [{"target": e.name, "reason": e.reason,
                      **({"last": last_changes(taken[e.name], gw.clock())} if e.name in taken else {})}
                     for e in d.excluded],
        "decision": d.header(),
    })


def _hedge(gw: Gateway, route: Any, opening: Opening | None) -> dict[str, Any]:
    """The route's race settings and the plan's race for the next request, as the walk would run it:
    who leads, who races from the start to be measured (``learner``, paid by ``pays``: free or the
    budget) or whom the budget refuses, and when the leader would be hedged (None: a pNN with too
    few of its samples, or a learner races it from the start and no timer is armed then)."""
    hedge = route.hedge
    learner = None if opening is None or opening.learner is None else opening.learner.name
    leader = None if opening is None else opening.leader
    delay = None
    if opening is not None and leader is not None and learner is None:
        delay = opening.hedge_after.get(leader.name)
    budget = gw.state.hedge_budget(route.name)
    return {
        "after": f"p{hedge.after_percentile}" if hedge.after_secs is None else hedge.after_secs,
        "delay_s": None if delay is None else round(delay, 4),
        "leader": None if leader is None else leader.name,
        "learner": learner,
        "pays": (opening.pays or None) if opening is not None else None,
        "refused": None if opening is None else opening.refused,
        "max_extra": hedge.max_extra,
        "budget_tokens": round(budget.tokens if budget is not None else START, 3),
        "budget_refused": budget.refused if budget is not None else 0,
        "explore": hedge.explore,
        "refresh_s": hedge.refresh_secs,
        "cap": hedge.cap,
    }


def _signals(gw: Gateway, route: Any, targets: Any, now: float, op: str,
             mode: str) -> tuple[dict[str, Any], str | None]:
    """Each candidate's score signals, from the same pure function the planner used."""
    if route.strategy != "score":
        return {}, None
    figures = {t.name: gw.state.figure(t.key, route.fastest, now, mode) for t in targets}
    scored, basis = score_targets(route.score, targets, figures, gw.state, op)
    out = {
        s.target.name: {"signals": {k: round(v, 4) for k, v in zip(SIGNALS, s.signals, strict=True)},
                        "score": round(s.total, 4)}
        for s in scored
    }
    return out, basis


async def own_metrics(request: web.Request) -> web.Response:
    """This process's series alone (a single process's /metrics; a worker's on its private socket)."""
    gw = request.app[GATEWAY]
    snapshot = gw.state.snapshot(gw.config, gw.clock())
    body, content_type = request.app[HUB].scrape(snapshot, gw.config.routes, gw.loaded, gw.fleet)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def metrics(request: web.Request) -> web.Response:
    """/metrics: one worker's answer is the whole box's (proxy/box.py), a single process's its own."""
    response = await own_metrics(request)
    box = request.app[GATEWAY].box
    if box is not None and response.body is not None:
        assert isinstance(response.body, bytes)
        response.body = (await box.metrics(response.body.decode())).encode()
    return response


def add_ops_routes(app: web.Application, hub: Hub | None) -> None:
    """Liveness, readiness and metrics: open to anyone who can reach the listener."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if hub is not None:
        app[HUB] = hub
        app.router.add_get("/metrics", metrics)


def build_ops_app(gw: Gateway, hub: Hub | None) -> web.Application:
    """The ``ops_listen`` app: health, readiness, metrics, /v1/health and explain, without client keys."""
    app = web.Application()
    app[GATEWAY] = gw
    app[ON_REFUSED] = refusals_logged(gw)
    add_ops_routes(app, hub)
    if hub is not None:
        from .status import add_status_routes  # status reads health_rows from here

        add_status_routes(app, main=False)
    app.router.add_get("/v1/health", logged(gw, health))
    app.router.add_get("/v1/routes/{route}/explain", logged(gw, explain))
    answer_every_path(app, logged(gw, not_an_ops_endpoint))
    return app


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def logged(gw: Gateway, inner: Handler) -> Handler:
    """An ops endpoint whose answers reach the access log, as the main listener's /v1 GETs do (the
    probes, ``/metrics`` and the status page are polled, and are not logged on either listener)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        t0 = gw.clock()
        response = await inner(request)
        if "x-request-id" not in response.headers:  # the answer and its log line share an id (explain's has one)
            response.headers["x-request-id"] = request_id(request)
        log_answer(gw, request, response, t0)
        return response

    return handle


async def not_an_ops_endpoint(request: web.Request) -> web.Response:
    """Anything else on the ops listener: a 404 in the OpenAI shape, like the main listener's."""
    body = error_body(f"Not Found: {request.method} {request.path} is not an endpoint of the ops listener "
                      "(see /healthz, /readyz, /metrics, /v1/health, /status).", "invalid_request_error",
                      code="http_404")
    return error_response(404, body)
