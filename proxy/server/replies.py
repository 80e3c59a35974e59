"""What every endpoint answers with: the app's typed keys, request ids, JSON and error replies."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import web
from aiohttp.web_urldispatcher import MatchInfoError, ResourceRoute, UrlMappingMatchInfo

from ..gateway import Gateway
from ..observe import Finished
from ..observe.hub import Hub
from ..routing.decision import HEADER, Decision

GATEWAY = web.AppKey("gateway", Gateway)
HUB = web.AppKey("hub", Hub)
JSON = "application/json"


_ids = random.Random()  # seeded from os.urandom once; ids need to be unique, not secret
# A worker forked from the supervisor (forked.py) draws its own: the sequence was each worker's alike.
os.register_at_fork(after_in_child=_ids.seed)


def new_id() -> str:
    return f"{_ids.getrandbits(48):012x}"  # os.urandom per request was ~5% of a buffered call's CPU


_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,63}$")  # fits the decision header's grammar


def request_id(request: web.Request) -> str:
    """The client's ``x-request-id`` when it is a safe token (1-64 of letters, digits, ``._:-``),
    so its logs and ours share the id; otherwise (or absent) a new one."""
    given = request.headers.get("x-request-id")
    if given is not None and _REQUEST_ID.match(given):
        return given
    return new_id()


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type=JSON, headers=headers)


def error_response(
    status: int, body: bytes, decision: Decision | None = None, request_id: str | None = None
) -> web.Response:
    headers = {}
    if decision is not None:
        headers[HEADER] = decision.header()
        request_id = decision.id
    if request_id is not None:
        headers["x-request-id"] = request_id
    return web.Response(body=body, status=status, content_type=JSON, headers=headers)


class _EveryPathRouter(web.UrlDispatcher):
    """aiohttp's router, except that "no resource matches" is the app's catch-all, not aiohttp's
    plain-text 404: a path its resource index cannot reach (``OPTIONS *``, ``CONNECT host:port``, an
    absolute URL without a path) gets the same JSON answer and access-log line as any other."""

    catch_all: ResourceRoute

    async def resolve(self, request: web.Request) -> UrlMappingMatchInfo:
        match = await super().resolve(request)
        if type(match) is MatchInfoError:
            return UrlMappingMatchInfo({"tail": request.path}, self.catch_all)
        return match


def answer_every_path(app: web.Application, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
    """Route every request no endpoint takes to ``handler``, whatever its path or method. Added
    last: it is the fallback. (``[\\s\\S]``, not ``.``, so a ``%0a`` in the path is matched too.)"""
    route = app.router.add_route("*", r"/{tail:[\s\S]*}", handler)
    app.router.__class__ = _EveryPathRouter  # the same router; only its "no match" differs
    app.router.catch_all = route  # type: ignore[attr-defined]


_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) (/[^?# \r\n]*)[^ \r\n]* HTTP/1\.[01]\r?\n")
HEAD_KEPT = 512  # of a request head cut by a read: enough for its request line


def request_line(head: bytes) -> tuple[str, str]:
    """The method and path of a request head that never ended (its 408's access line), as aiohttp
    reads them for a whole one (the path percent-decoded, no query); ``-`` for each when the first
    ``HEAD_KEPT`` bytes hold no whole request line."""
    found = _REQUEST_LINE.match(head)
    if found is None:
        return "-", "-"
    return found[1].decode(), unquote(found[2].decode("utf-8", "replace"), errors="replace")


def log_answer(gw: Gateway, request: web.BaseRequest, response: web.StreamResponse, t0: float) -> None:
    """Hand an answer that was not routed (401, 404, models, health, a parser's 400…) to the observers, with
    its id, size and error code, so the access log has a line for every answer."""
    log_refused(gw, request.remote or "-", request.method, request.path, response, t0)


def refusals_logged(gw: Gateway) -> Callable[[str, str, str, web.StreamResponse], None]:
    """An app's ``ON_REFUSED`` (server/listener.py): what its listener answered itself, to the access log."""
    return lambda remote, method, path, response: log_refused(gw, remote, method, path, response, gw.clock())


def log_refused(gw: Gateway, remote: str, method: str, path: str, response: web.StreamResponse, t0: float) -> None:
    """``log_answer`` for what the listener answered itself (a parser's 400, a head's 408, the cap's 503)."""
    body = getattr(response, "body", None)
    size = len(body) if isinstance(body, bytes) else (response.content_length or 0)
    error = None
    if response.status >= 400 and isinstance(body, bytes):
        error = _error_code(body)
    rid = response.headers.get("x-request-id")
    now = gw.clock()
    gw.outbox.finished(Finished(None, time.time() - (now - t0), remote, method, path,
                                response.status, "", False, now - t0, now - t0, size, error, rid))


def _error_code(body: bytes) -> str | None:
    """The ``code`` (else ``type``) of an OpenAI- or Anthropic-shape error body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    code = error.get("code") or error.get("type")
    return code if isinstance(code, str) else None
