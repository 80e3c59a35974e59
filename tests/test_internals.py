"""The start-up check of aiohttp's internals (proxy/internals.py) and the public paths it falls back to.

The check is fed stand-ins that lack an internal or misbehave, as a moved aiohttp would; nothing of
firstbyte's own is replaced. The fallbacks then serve real requests on loopback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.web_protocol import RequestHandler

from proxy.internals import check, check_client, check_relay, check_server
from proxy.upstream.session_pool import SessionPool

from .conftest import CHAT, FakeUpstream, Proxy, decision_of, ok_handler, openai_provider, route_config


class OlderResponseHandler(ResponseHandler):
    """aiohttp's client protocol as an older release had it: no ``read_bufsize`` parameter."""

    def set_response_params(self, *, read_until_eof: bool = False,  # type: ignore[override]
                            auto_decompress: bool = True) -> None:
        super().set_response_params(read_until_eof=read_until_eof, auto_decompress=auto_decompress)


class NeverClosingResponseHandler(ResponseHandler):
    """A client protocol whose ``should_close`` no longer reads ``Connection: close``."""

    @property
    def should_close(self) -> bool:
        return False


class RenamedTimerHandler(RequestHandler):
    """A server protocol whose idle timer moved to another name (``_keepalive_handle`` is gone)."""

    @property
    def _keepalive_handle(self) -> asyncio.Handle | None:  # type: ignore[override]
        raise AttributeError("_keepalive_handle")

    @_keepalive_handle.setter
    def _keepalive_handle(self, value: asyncio.Handle | None) -> None:
        self.__dict__["idle_timer"] = value


class SlottedServer(web.Server):
    """A server whose class cannot be swapped for another (``__slots__`` differ)."""

    __slots__ = ("extra",)


class WithoutMakeServer:
    """A runner without ``_make_server``."""


class WithoutFlag:
    """A response class without aiohttp's ``_send_headers_immediately``."""


async def test_the_installed_aiohttp_passes_the_check() -> None:
    found = await check()
    assert (found.client, found.server, found.relay) == ((), (), ())
    assert found.health() == {"version": aiohttp.__version__, "internals": "used", "fallback": [], "problems": []}


@pytest.mark.parametrize(
    ("stand_in", "problem"),
    [
        pytest.param(asyncio.Protocol, "Protocol.set_response_params is missing", id="no-client-protocol"),
        pytest.param(OlderResponseHandler, "TypeError", id="set-response-params-signature-changed"),
        pytest.param(NeverClosingResponseHandler, "should_close read False after Connection: close",
                     id="should-close-misbehaves"),
    ],
)
async def test_a_client_protocol_without_what_the_pool_uses_is_found(stand_in: type, problem: str) -> None:
    problems = await check_client(stand_in)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        pytest.param({"runner": WithoutMakeServer}, "WithoutMakeServer._make_server is missing", id="no-make-server"),
        pytest.param({"handler": RenamedTimerHandler}, "RenamedTimerHandler._keepalive_handle is missing",
                     id="idle-timer-renamed"),
        pytest.param({"server": SlottedServer}, "__class__", id="server-class-cannot-be-swapped"),
    ],
)
async def test_a_server_without_what_the_listener_uses_is_found(kwargs: dict[str, type], problem: str) -> None:
    problems = await check_server(**kwargs)
    assert any(problem in p for p in problems), problems


def test_a_response_class_without_the_header_switch_is_found() -> None:
    assert check_relay(WithoutFlag) == ("WithoutFlag._send_headers_immediately is None, not aiohttp's True",)


async def test_the_summary_says_what_falls_back() -> None:
    found = await check(client=asyncio.Protocol, response=WithoutFlag)
    assert found.fallbacks == ("client", "relay")
    assert found.summary().startswith(f"aiohttp {aiohttp.__version__}: falling back to public paths: "
                                      "upstream calls go through aiohttp.ClientSession")
    assert found.health()["internals"] == "fallback"


async def test_upstream_calls_go_through_client_session_when_the_client_protocol_moved(
    upstreams: Callable[..., Awaitable[FakeUpstream]], proxy: Callable[..., Awaitable[Proxy]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    up = await upstreams({"/v1/chat/completions": ok_handler("hello there", chunks=3)})
    internals = await check(client=OlderResponseHandler)
    config = route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)})
    with caplog.at_level(logging.WARNING, logger="firstbyte"):
        p = await proxy(config, internals=internals)
    assert isinstance(p.gateway.pool, SessionPool)
    assert any("upstream calls go through aiohttp.ClientSession" in r.getMessage() for r in caplog.records)
    for stream in (True, False):
        status, headers, body = await p.post("/v1/chat/completions", {**CHAT, "stream": stream})
        assert status == 200 and b"hello" in body, body
        assert decision_of(headers).served == "up"
    status, health = await p.get("/v1/health")
    assert health["aiohttp"]["fallback"] == ["client"]
    assert "TypeError" in health["aiohttp"]["problems"][0]


async def test_a_refused_connect_through_client_session_is_refused_and_fails_over(
    upstreams: Callable[..., Awaitable[FakeUpstream]], proxy: Callable[..., Awaitable[Proxy]],
) -> None:
    up = await upstreams({"/v1/chat/completions": ok_handler("hello")})
    dead = await upstreams({})
    dead_url = dead.url
    await dead.stop()
    internals = await check(client=asyncio.Protocol)
    config = route_config([{"provider": "dead", "model": "m"}, {"provider": "up", "model": "m"}],
                          {"dead": openai_provider(dead_url), "up": openai_provider(up.url)})
    p = await proxy(config, internals=internals)
    status, headers, _ = await p.post("/v1/chat/completions", CHAT)
    assert status == 200
    assert decision_of(headers).attempts[0][0] == "dead"
    assert decision_of(headers).attempts[0][1].startswith("refused")
    assert decision_of(headers).served == "up"


async def test_client_connections_are_aiohttps_own_when_the_server_internals_moved(
    proxy: Callable[..., Awaitable[Proxy]], upstreams: Callable[..., Awaitable[FakeUpstream]],
) -> None:
    """Served, but without the guard: a malformed head gets aiohttp's own plain-text 400, not ours."""
    up = await upstreams({"/v1/chat/completions": ok_handler("hello")})
    internals = await check(handler=RenamedTimerHandler)
    p = await proxy(route_config([{"provider": "up", "model": "m"}], {"up": openai_provider(up.url)}),
                    internals=internals)
    status, _, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 200 and b"hello" in body
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request") and b"text/plain" in answer  # not ours
    status, health = await p.get("/v1/health")
    assert health["aiohttp"]["fallback"] == ["server"]
    assert p.guards[0].conns == set()  # no GuardedHandler was made



async def test_the_start_up_probe_writes_no_access_log_line(caplog):
    """The server check answers one stand-in request; aiohttp's access logger used to log it at
    every start (``aiohttp.access`` "GET /probe 200"), a request no client made."""
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    assert await check_server() == ()
    assert [r for r in caplog.records if r.name == "aiohttp.access"] == []
