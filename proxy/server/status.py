"""``/status``: a live page over what ``/v1/health`` and explain already read, and the last hour.

The page itself is two static files shipped in the package (``static/status.html`` and
``status.js``: no CDN, it works with no network); the script polls ``/status/data`` every
couple of seconds. That JSON is the state's snapshot (the very rows of ``/v1/health``), each
route's order as explain computes it (``plan()`` without exploring, on a copy of the route's
generator, so a poll draws nothing a request would), and the history observer's last hour.
Nothing here decides or changes anything, and nothing runs unless someone looks.

On the ops listener it is always served; on the main listener only while no client keys are
set (the page shows routes, targets and recent decisions, which a keyed gateway keeps to
those who can reach its ops listener).
"""

from __future__ import annotations

import random
import time
from importlib import resources
from typing import Any

from aiohttp import web

from ..errors import error_body
from ..gateway import Gateway
from ..routing.plan import Ask, plan
from ..state.tracker import STREAMED
from .ops import health_rows
from .replies import GATEWAY, HUB, error_response, json_response

__all__ = ["add_status_routes", "fleet_link", "status_data"]

_STATIC = resources.files(__package__) / "static"
_FILES = {"/status": ("status.html", "text/html"), "/status/status.js": ("status.js", "text/javascript")}


def fleet_link(gw: Gateway) -> dict[str, Any]:
    """The fleet link (shared state over Redis, ``state: {redis, fleet}``) as the page shows it: a
    gateway with no fleet is ``alone``; with one, the link's own status (``in-fleet`` or ``alone``
    and why, since when, the peers heard from)."""
    if gw.fleet is None:
        return {"link": "alone"}
    return {"link": "in-fleet" if gw.fleet.connected else "alone", **gw.fleet.status()}


def _routes(gw: Gateway, now: float) -> list[dict[str, Any]]:
    """Each route's order now, as explain shows it, and its exclusions."""
    config = gw.config
    out = []
    for name, route in config.routes.items():
        rng = random.Random()
        rng.setstate(gw.rng(name).getstate())
        d = plan(config, Ask("status", name, mode=STREAMED), gw.state, now, rng, explore=False).decision
        out.append({
            "name": name,
            "strategy": route.strategy,
            "hedged": route.hedge is not None,
            "order": [{"target": r.name, "detail": r.detail} for r in d.order],
            "excluded": [{"target": e.name, "reason": e.reason} for e in d.excluded],
        })
    return out


def status_data(gw: Gateway, history: Any) -> dict[str, Any]:
    """Everything the page draws, in one JSON document."""
    return {
        "now": time.time(),
        "config": gw.config.source,
        "loaded_at": gw.loaded.at,
        "reload_ok": gw.loaded.ok,
        "draining": gw.draining,
        "fleet": fleet_link(gw),
        "routes": _routes(gw, gw.clock()),
        "targets": health_rows(gw),
        "history": history.view(time.time()),
    }


def _keyed(gw: Gateway) -> web.Response | None:
    """On the main listener of a gateway with client keys: a 404 that says where the page is."""
    if not gw.config.clients.keys:
        return None
    body = error_body("The status page is served on the ops listener (ops_listen) when client keys are set.",
                      "invalid_request_error", code="http_404")
    return error_response(404, body)


def add_status_routes(app: web.Application, *, main: bool) -> None:
    """``/status``, its script and its data; ``main``: the main listener (no page behind keys)."""

    async def page(request: web.Request) -> web.StreamResponse:
        gw = request.app[GATEWAY]
        refused = _keyed(gw) if main else None
        if refused is not None:
            return refused
        name, content_type = _FILES[request.path]
        return web.Response(body=(_STATIC / name).read_bytes(), content_type=content_type,
                            headers={"cache-control": "no-cache"})

    async def data(request: web.Request) -> web.StreamResponse:
        gw = request.app[GATEWAY]
        refused = _keyed(gw) if main else None
        if refused is not None:
            return refused
        return json_response(status_data(gw, request.app[HUB].history), headers={"cache-control": "no-store"})

    for path in _FILES:
        app.router.add_get(path, page)
    app.router.add_get("/status/data", data)
