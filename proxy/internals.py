"""The aiohttp internals firstbyte relies on, checked once at start (docs/adr/0018).

Three places reach past aiohttp's public API, each for a measured reason:

- the upstream client (``proxy/upstream/http1.py``, ``connection.py``) drives aiohttp's client protocol
  (``ResponseHandler``: ``set_response_params``, ``read``, ``should_close``) instead of
  ``ClientSession``, about 100 µs less CPU per call (docs/adr/0011);
- the client listener (``proxy/server/listener.py``) subclasses ``RequestHandler`` and reads its
  ``_keepalive_handle``, ``_request_handler``, ``_messages``, ``_waiter`` and
  ``_next_keepalive_close_time``, builds handlers from
  ``Server._kwargs`` and swaps the class of the server ``AppRunner._make_server`` made, for the
  connection bounds of docs/adr/0010;
- the relay (``proxy/relay.py``) turns off ``StreamResponse._send_headers_immediately`` so the
  headers leave with the first chunk in one write.

These change within aiohttp 3.x without notice. :func:`check` looks at each one and makes it do
its job on a stand-in transport (no socket, no network), so an aiohttp whose internals moved is
found at start, not by a client. What fails falls back to aiohttp's public paths
(``ClientSession``; plain ``AppRunner`` protocols; headers written at ``prepare()``), and the log
line and ``/v1/health`` say which. The check takes the classes it looks at as arguments, so the
tests feed it stand-ins that lack an internal and watch the fallback happen.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("firstbyte")

_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Probe: yes\r\n\r\nhi"
_CLOSING = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_GONE = object()
_REQUEST = b"GET /probe HTTP/1.1\r\nHost: probe\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Internals:
    """What the check found: one tuple of problems per place; empty means its internals are used."""

    version: str
    client: tuple[str, ...] = ()
    server: tuple[str, ...] = ()
    relay: tuple[str, ...] = ()

    @property
    def fallbacks(self) -> tuple[str, ...]:
        return tuple(name for name in ("client", "server", "relay") if getattr(self, name))

    def health(self) -> dict[str, Any]:
        """The ``aiohttp`` block of ``/v1/health``."""
        return {"version": self.version, "internals": "fallback" if self.fallbacks else "used",
                "fallback": list(self.fallbacks),
                "problems": [f"{name}: {p}" for name in self.fallbacks for p in getattr(self, name)]}

    def log(self) -> None:
        """Say at start what the check found: a warning when anything falls back."""
        (log.warning if self.fallbacks else log.info)("%s", self.summary())

    def summary(self) -> str:
        """The start-up log line."""
        if not self.fallbacks:
            return f"aiohttp {self.version}: the internals firstbyte uses are there and behave"
        what = {"client": "upstream calls go through aiohttp.ClientSession (about 100 us more CPU a call)",
                "server": "client connections are aiohttp's own (no header/body deadlines, cap or "
                          "OpenAI-shape parser errors from firstbyte)",
                "relay": "response headers go in a write of their own"}
        parts = [f"{what[name]} ({'; '.join(getattr(self, name))})" for name in self.fallbacks]
        return f"aiohttp {self.version}: falling back to public paths: " + "; ".join(parts)


class StandInTransport(asyncio.Transport):
    """A transport that goes nowhere: the check's protocols write into ``written``."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def _missing(owner: object, names: tuple[str, ...]) -> list[str]:
    label = getattr(owner, "__name__", type(owner).__name__)
    return [f"{label}.{name} is missing" for name in names if not hasattr(owner, name)]


async def check_client(handler: type = ResponseHandler) -> tuple[str, ...]:
    """``http1.Pool``'s use of the client protocol: parameters set, an answer parsed into a status,
    headers and body, and ``should_close`` false on a kept-alive answer, true on ``Connection: close``."""
    missing = _missing(handler, ("set_response_params", "should_close", "read", "is_connected",
                                 "connection_made", "data_received", "close"))
    if missing:
        return tuple(missing)
    loop = asyncio.get_running_loop()
    problems: list[str] = []
    protocol = handler(loop)
    try:
        protocol.connection_made(StandInTransport())
        for answer, closes in ((_ANSWER, False), (_CLOSING, True)):
            protocol.set_response_params(read_until_eof=True, auto_decompress=True, read_bufsize=2**16)
            protocol.data_received(answer)
            message, content = await asyncio.wait_for(protocol.read(), 1.0)
            body = await asyncio.wait_for(content.read(), 1.0)
            if message.code != 200 or body != (b"hi" if not closes else b""):
                problems.append(f"parsed {message.code} {body!r} from a 200 answer")
            if bool(protocol.should_close) is not closes:
                problems.append(f"should_close read {protocol.should_close!r} after "
                                f"{'Connection: close' if closes else 'a kept-alive answer'}")
    except Exception as exc:  # anything at all: the internals did not behave
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        protocol.close()
    return tuple(problems)


async def _echo(request: web.BaseRequest) -> web.StreamResponse:
    return web.Response(text="probe")


def _server_parts(runner: type, server: type, handler: type) -> list[str]:
    """The names the listener reaches for, before anything is built from them."""
    problems = _missing(runner, ("_make_server",)) + _missing(server, ("__call__",))
    make = getattr(runner, "_make_server", None)
    if make is not None and not inspect.iscoroutinefunction(make):
        problems.append(f"{runner.__name__}._make_server is not a coroutine function")
    return problems + _missing(handler, ("connection_made", "data_received", "connection_lost",
                                         "handle_error", "log_exception", "force_close"))


async def check_server(runner: type = web.AppRunner, server: type = web.Server,
                       handler: type = RequestHandler) -> tuple[str, ...]:
    """``listener.GuardedRunner``'s use of the server: a ``Server`` whose class may be swapped and
    whose ``_kwargs`` build a handler; the handler's idle timer (``_keepalive_handle``, which the
    listener cancels when aiohttp arms it at connect), its ``_request_handler``, a whole head queued
    in ``_messages`` before its task runs, and the request answered."""
    problems = _server_parts(runner, server, handler)
    if problems:
        return tuple(problems)
    loop = asyncio.get_running_loop()
    before = asyncio.all_tasks()
    built = server(_echo, handler_cancellation=True, keepalive_timeout=15.0, access_log=None)  # a probe, not a client
    protocol = None
    try:
        built.__class__ = type("SwappedServer", (web.Server,), {})  # GuardedRunner's swap to its subclass
        kwargs = getattr(built, "_kwargs", None)
        if not isinstance(kwargs, dict):
            return (f"{server.__name__}._kwargs is {type(kwargs).__name__}, not the handler's keywords",)
        protocol = handler(built, loop=loop, **kwargs)
        transport = StandInTransport()
        protocol.connection_made(transport)
        # the idle timer may be unarmed (None) at connect, as before aiohttp 3.11; it must be there to cancel
        # idle keep-alive connections are told by _waiter and ordered by _next_keepalive_close_time
        for name in ("_keepalive_handle", "_waiter", "_next_keepalive_close_time"):
            if getattr(protocol, name, _GONE) is _GONE:
                problems.append(f"{handler.__name__}.{name} is missing")
        for name in ("_request_handler", "_messages"):
            if getattr(protocol, name, None) is None:
                problems.append(f"{handler.__name__}.{name} is not set on a new connection")
        if not problems:
            protocol.data_received(_REQUEST)
            if len(protocol._messages) != 1:
                problems.append(f"a whole request head left {len(protocol._messages)} messages queued")
            problems += await _answered(transport)
    except Exception as exc:  # anything at all: the internals did not behave
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        await _hang_up(protocol, before)
    return tuple(problems)


async def _hang_up(protocol: Any, before: set[asyncio.Task[Any]]) -> None:
    """End the probe connection and whatever task it started, even when the handler misbehaves."""
    try:
        if protocol is not None:
            protocol.connection_lost(None)
    except Exception as exc:  # a handler whose internals moved may fail here too: already reported
        log.debug("the probe connection did not close cleanly: %r", exc)
    started = asyncio.all_tasks() - before - {asyncio.current_task()}
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)


async def _answered(transport: StandInTransport) -> list[str]:
    """The handler's task answers the queued request (a few loop turns; 100 at most)."""
    for _ in range(100):
        if b"probe" in b"".join(transport.written):
            return []
        await asyncio.sleep(0)
    return [f"the probe request was not answered (wrote {b''.join(transport.written)[:80]!r})"]


def check_relay(response: type = web.StreamResponse, writer: type = aiohttp.http.StreamWriter) -> tuple[str, ...]:
    """``relay._CommitResponse``'s switch: aiohttp's own flag on ``StreamResponse`` (on by default,
    off on ``web.Response``) and the writer's ``send_headers`` it defers to."""
    flag = response.__dict__.get("_send_headers_immediately")
    problems = []
    if flag is not True:
        problems.append(f"{response.__name__}._send_headers_immediately is {flag!r}, not aiohttp's True")
    return tuple(problems + _missing(writer, ("send_headers",)))


async def check(*, client: type = ResponseHandler, runner: type = web.AppRunner, server: type = web.Server,
                handler: type = RequestHandler, response: type = web.StreamResponse,
                writer: type = aiohttp.http.StreamWriter) -> Internals:
    """Every internal firstbyte relies on, checked on the classes given (aiohttp's own by default)."""
    return Internals(aiohttp.__version__, await check_client(client), await check_server(runner, server, handler),
                     check_relay(response, writer))


_checked: Internals | None = None


async def checked() -> Internals:
    """The installed aiohttp's check, run once per process."""
    global _checked
    if _checked is None:
        _checked = await check()
    return _checked


if __name__ == "__main__":  # python -m proxy.internals: what an aiohttp upgrade checks first (docs/adr/0018)
    print(asyncio.run(check()).summary())
