"""Endpoints for operators and tools: models, liveness, readiness, target health, explain, metrics.

Explain calls the very same ``plan()`` a request gets (without exploring), so it
cannot drift from what traffic sees.
"""

from __future__ import annotations

import random
from typing import Any

from aiohttp import web

from .errors import error_body
from .gateway import Gateway
from .observe.hub import Hub
from .replies import GATEWAY, HUB, error_response, json_response
from .routing.plan import Ask, plan
from .routing.score import score_targets


async def models(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    created = int(gw.loaded_at)
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "firstbyte"}
        for name in gw.config.routes
    ]
    return json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    if gw.draining:
        return json_response({"status": "draining"}, status=503)
    return json_response({"status": "ready", "config": gw.config.source,
                          "routes": len(gw.config.routes)})


async def health(request: web.Request) -> web.Response:
    """Every target of every route: figure, samples, age, breaker, failures, in flight."""
    gw = request.app[GATEWAY]
    now = gw.clock()
    out = []
    for route in gw.config.routes.values():
        for target in route.targets:
            h = gw.state.health(target.key, now)
            figure = gw.state.figure(target.key, route.fastest, now)
            age = gw.state.tracker.age(target.key, now)
            ts = gw.state.targets.get(target.key)
            out.append({
                "route": route.name,
                "target": target.name,
                "provider": target.provider,
                "model": target.model,
                "figure_s": None if figure is None else round(figure, 4),
                "samples": gw.state.tracker.samples(target.key),
                "age_s": None if age is None else round(age, 3),
                "breaker": h.state,  # closed | open | half-open (next call probes) | probing
                "seconds_left": round(h.seconds_left, 3),  # open: until the probe may go
                "cooling_s": round(h.cooling, 3),  # a Retry-After cool-down still running
                "failures": h.failures,  # consecutive failover-safe failures
                "in_flight": 0 if ts is None else ts.in_flight,
            })
    return json_response({"targets": out})


async def explain(request: web.Request) -> web.Response:
    """The order a request would get now, without exploring: the very same plan()."""
    gw = request.app[GATEWAY]
    name = request.match_info["route"]
    config = gw.config
    if name not in config.routes:
        known = ", ".join(config.routes) or "none"
        body = error_body(f"No route '{name}' (routes: {known}).", "invalid_request_error",
                          code="model_not_found")
        return error_response(404, body)
    route = config.routes[name]
    rng = random.Random()
    rng.setstate(gw.rng(name).getstate())  # a weighted draw shows what the next request draws
    now = gw.clock()
    op = request.query.get("op", "chat")
    planned = plan(config, Ask("explain", name, op=op), gw.state, now, rng, explore=False)
    d = planned.decision
    signals, basis = _signals(gw, route, planned.targets, now, op)
    order = []
    for ranked, target in zip(d.order, planned.targets, strict=True):
        figure = gw.state.figure(target.key, route.fastest, now)
        order.append({
            "target": target.name,
            "detail": ranked.detail,
            "figure_s": None if figure is None else round(figure, 4),
            "samples": gw.state.tracker.samples(target.key),
            "price": None if target.price is None else target.price.total,
            "quality": target.quality,
            **signals.get(target.name, {}),
        })
    return json_response({
        "route": name,
        "strategy": route.strategy,
        **({"cost_basis": basis} if basis else {}),
        "order": order,
        "excluded": [{"target": e.name, "reason": e.reason} for e in d.excluded],
        "decision": d.header(),
    })


def _signals(gw: Gateway, route: Any, targets: Any, now: float, op: str) -> tuple[dict[str, Any], str | None]:
    """Each candidate's score signals, from the same pure function the planner used."""
    if route.strategy != "score":
        return {}, None
    figures = {t.name: gw.state.figure(t.key, route.fastest, now) for t in targets}
    scored, basis = score_targets(route.score, targets, figures, gw.state, op)
    out = {
        s.target.name: {"signals": {k: round(s.signal(k), 4) for k in ("speed", "cost", "health", "quality")},
                        "score": round(s.total, 4)}
        for s in scored
    }
    return out, basis


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[HUB].scrape(request.app[GATEWAY])
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_ops_routes(app: web.Application, hub: Hub | None) -> None:
    """Liveness, readiness and metrics: open to anyone who can reach the listener."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if hub is not None:
        app[HUB] = hub
        app.router.add_get("/metrics", metrics)


def build_ops_app(gw: Gateway, hub: Hub | None) -> web.Application:
    """The ``ops_listen`` app: health, readiness, metrics and /v1/health, without client keys."""
    app = web.Application()
    app[GATEWAY] = gw
    add_ops_routes(app, hub)
    app.router.add_get("/v1/health", health)
    app.router.add_route("*", "/{tail:.*}", not_an_ops_endpoint)
    return app


async def not_an_ops_endpoint(request: web.Request) -> web.Response:
    """Anything else on the ops listener: a 404 in the OpenAI shape, like the main listener's."""
    body = error_body(f"Not Found: {request.method} {request.path} is not an endpoint of the ops listener "
                      "(see /healthz, /readyz, /metrics, /v1/health).", "invalid_request_error", code="http_404")
    return error_response(404, body)
