"""The fault drill: firstbyte as deployed (``firstbyte serve`` in a subprocess) against an upstream that misbehaves.

A raw TCP upstream speaks HTTP by hand so it can hang, reset before or after
the headers, cut a chunked body, send malformed SSE, garbage bytes, a 10 MB
chunk or an endless stream; the request body's ``drill`` field picks the fault.
The drill checks that every answer is either valid or an OpenAI-shape error,
that a slow reader holds the upstream back instead of filling firstbyte's
memory, that clients leaving by the thousand release every upstream
connection, and that a 10,000-request soak of random faults (with clients that stop reading and
keep-alive connections idling past ``connections.max`` beside it) leaves no
traceback in firstbyte's log and its open fds and RSS back at baseline
(read from ``/proc/PID`` after a warm-up of the same mix). Its figures go to ``bench-results/fault-drill.txt``
and to the pytest terminal summary.

Bounded: each test has a timeout; the soak alone took 78-158 s on a shared 2-core machine under load
(load average 7-15), hence its 240 s bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from .conftest import stop_process

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "bench-results" / "fault-drill.txt"
FIGURES: list[str] = []  # printed by conftest's terminal summary hook and written to REPORT
FORBIDDEN = ("Traceback", "Error handling request", "Task exception was never retrieved",
             "Unclosed", "Exception in callback")
FD_TOLERANCE = 2  # open fds after the drill: at most this many above baseline
RSS_TOLERANCE_MB = 16.0  # resident memory after the soak: at most this much above baseline

HEAD_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
HEAD_SSE_GZIP = HEAD_SSE.replace(b"Connection:", b"Content-Encoding: gzip\r\nConnection:")
KEY = "sk-drill-0123456789abcdef"  # the fault provider's key: no answer and no log line may hold it
FORGED = b"id=forged; route=solo; strategy=ordered; order=evil(written); served=evil"
END = b"0\r\n\r\n"
SEND_TIMEOUT = 2.0  # connections.send_timeout of the drill's firstbyte: a client reading nothing is cut past it
CONNECTIONS_MAX = 320  # connections.max of the drill's firstbyte: the soak's idle keep-alive fill goes past it


def record(line: str) -> None:
    """A drill figure: shown with ``-s``, in the terminal summary and in REPORT."""
    print(line)
    REPORT.parent.mkdir(exist_ok=True)
    with REPORT.open("a" if FIGURES else "w") as f:
        f.write(line + "\n")
    FIGURES.append(line)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(i: int, size: int = 0) -> bytes:
    payload = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": f"t{i} " + "x" * size}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def http(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (status, content_type, len(body)) + body)


def rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset, not a FIN."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


_GZIP: dict[str, list[bytes]] = {}


def gzip_pieces(kind: str) -> list[bytes]:
    """Chunks of one gzip stream: 1 MiB of events each (``gzip_endless``, about 60 MiB, enough for a
    1.5 s total deadline) or of an event's data that never ends (``gzip_noend``: 24 MiB, past the
    16 MiB bound). The last chunk repeats: past the bound or the deadline nobody inflates it."""
    if kind not in _GZIP:
        packer = zlib.compressobj(6, zlib.DEFLATED, 31)
        if kind == "gzip_noend":
            raw = [b"data: " + b"x" * 2**20] + [b"x" * 2**20] * 23
        else:
            raw = [event(0, 200) * 4000] * 60
        _GZIP[kind] = [chunk(packer.compress(piece) + packer.flush(zlib.Z_SYNC_FLUSH)) for piece in raw]
    return _GZIP[kind]


# --- issue 31: upstreams that say more than they were asked ------------------------------------------
# Kept apart from FaultUpstream's faults (which close after each answer): these keep the connection
# alive, so firstbyte's pool would reuse it, and answer with the request's own ``drill.echo`` token, so
# a misdelivered answer is visible to the client that gets it (``no_wrong_answer``).

EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n" * 1000  # ~60 KB a write
STRAY_AFTER = 0.02  # the unasked answer follows the real one this long after, as the issue saw it
STRAY = b"STRAY-"  # only an answer nobody asked for holds this


async def interim_flood(drill: dict[str, Any], stream: bool, writer: asyncio.StreamWriter) -> bool:
    """103 Early Hints as fast as firstbyte takes them, never a final answer."""
    while True:
        writer.write(EARLY_HINTS)
        await writer.drain()


def echo_answer(text: str, stream: bool) -> bytes:
    """A kept-alive answer whose content is ``text``: buffered JSON, or one SSE event and [DONE]."""
    if stream:
        data = b"data: " + orjson.dumps({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                         "choices": [{"index": 0, "delta": {"content": text},
                                                      "finish_reason": None}]}) + b"\n\ndata: [DONE]\n\n"
        kind = b"text/event-stream"
    else:
        data = orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "stop"}]})
        kind = b"application/json"
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (kind, len(data), data)


async def stray_answer(drill: dict[str, Any], stream: bool, writer: asyncio.StreamWriter) -> bool:
    """The request's echo, kept alive; ``STRAY_AFTER`` later the same answer again, marked, unasked."""
    token = str(drill.get("echo", ""))
    writer.write(echo_answer(f"echo:{token}", stream))
    await writer.drain()
    await asyncio.sleep(STRAY_AFTER)
    writer.write(echo_answer(f"{STRAY.decode()}{token}", stream))
    await writer.drain()
    return True


UPSTREAM_ATTACKS = {"interim_flood": interim_flood, "stray": stray_answer}


def no_wrong_answer(data: bytes, token: str) -> None:
    """No client gets an answer meant for another: never an unasked one, and an echo only of its own token."""
    assert STRAY not in data, data[:300]
    if b"echo:" in data:
        assert f"echo:{token}".encode() in data, (token, data[:300])


class FaultUpstream:
    """An OpenAI-ish upstream written by hand; ``drill.kind`` in the request body picks the fault."""

    def __init__(self) -> None:
        self.open = 0  # connections being served now
        self.sent = 0  # body bytes written, all connections
        self.url = ""
        self.server: asyncio.Server | None = None

    async def start(self) -> FaultUpstream:
        # A deployed upstream listens with a deep accept queue; asyncio's default (100) overflows when the
        # drill opens 200 streams at once, and the kernel's SYN retry then lands on firstbyte's 1 s connect timeout.
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=2048)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            while await self._request(reader, writer):  # True: the answer kept the connection open
                pass
        except (ConnectionError, asyncio.IncompleteReadError, orjson.JSONDecodeError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it as its ``drill.kind`` says; True if the connection stays open."""
        length = 0
        auth = ""
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            elif line.lower().startswith(b"authorization:"):
                auth = line.split(b":", 1)[1].strip().decode()
        body = orjson.loads(await reader.readexactly(length))
        drill = {**(body.get("drill") or {}), "_auth": auth}
        kind = "ok" if body.get("model") == "ok" else drill.get("kind", "ok")
        if kind in UPSTREAM_ATTACKS:
            return await UPSTREAM_ATTACKS[kind](drill, bool(body.get("stream")), writer)
        await self._fault(kind, drill, bool(body.get("stream")), reader, writer)
        return False

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        self.sent += len(data)
        await writer.drain()

    async def _fault(self, kind: str, drill: dict[str, Any], stream: bool,
                     reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        after = int(drill.get("after", 1))
        if kind == "hang":
            await reader.read()  # until the proxy gives up and closes
        elif kind == "reset_before":
            rst(writer)
        elif kind == "garbage":
            await self._write(writer, b"\x00\xff\xfeNOT HTTP\r\n\r\n" + os.urandom(64))
        elif kind == "status500":
            await self._write(writer, http(500, b'{"error": {"message": "boom", "type": "server_error"}}'))
        elif kind == "echo_key":  # an upstream that quotes the key it was sent, in JSON and in text
            sent = drill.get("_auth", "")
            await self._write(writer, http(int(drill.get("status", 401)),
                                           b'{"error": {"message": "bad key %s", "type": "x"}} and %s'
                                           % (sent.encode(), sent.encode())))
        elif kind == "notjson" and not stream:
            await self._write(writer, http(200, b"<html>upstream proxy error</html>", b"text/html"))
        elif kind == "forged_headers" and not stream:
            await self._write(writer, http(200, orjson.dumps({
                "id": "x", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": "3", "completion_tokens": [1]}})).replace(
                b"Connection: close", b"X-Route-Decision: " + FORGED + b"\r\nSet-Cookie: s=1\r\n"
                b"X-Request-Id: forged\r\nConnection: close, X-Hop\r\nX-Hop: 1"))
        elif kind in ("gzip_noend", "gzip_endless"):
            await self._write(writer, HEAD_SSE_GZIP)
            await self._gzip_stream(kind, writer)
        elif kind == "status400":
            await self._write(writer, http(400, b'{"error": {"message": "bad", "type": "invalid_request_error",'
                                                b' "param": null, "code": null}}'))
        elif not stream:
            await self._write(writer, http(200, orjson.dumps({
                "id": "x", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}]})))
        else:
            head = HEAD_SSE
            if kind == "forged_headers":
                head = HEAD_SSE.replace(b"Connection: close", b"X-Route-Decision: " + FORGED
                                        + b"\r\nX-Request-Id: forged\r\nConnection: close")
            await self._write(writer, head)
            await self._stream(kind, drill, after, reader, writer)

    async def _gzip_stream(self, kind: str, writer: asyncio.StreamWriter) -> None:
        """Highly compressed and endless: a few KB on the wire inflate to a megabyte each. ``gzip_noend``
        is one event that never ends (no blank line); ``gzip_endless`` valid events without end. The
        compressed bytes are made once per process, so the drill's own CPU goes to sending them."""
        pieces = gzip_pieces(kind)
        i = 0
        while True:
            await self._write(writer, pieces[i] if i < len(pieces) else pieces[-1])
            i += 1
            await asyncio.sleep(0)

    async def _stream(self, kind: str, drill: dict[str, Any], after: int,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if kind == "endless":
            size, pause = int(drill.get("size", 0)), float(drill.get("pause", 0.002))
            i = 0
            while True:
                await self._write(writer, chunk(event(i, size)))
                i += 1
                if pause:
                    await asyncio.sleep(pause)
        if kind == "noend":  # one event that never ends: bytes without a blank line, as fast as taken
            await self._write(writer, chunk(b"data: "))
            filler = chunk(b"x" * 65536)
            while True:
                await self._write(writer, filler)
        if kind == "string_usage":
            await self._write(writer, chunk(event(0) + b'data: {"id": "x", "object": "chat.completion.chunk", '
                                            b'"created": 1, "model": "m", "choices": [], "usage": '
                                            b'{"prompt_tokens": "5", "completion_tokens": "x"}}\n\n'))
            await self._write(writer, chunk(b"data: [DONE]\n\n") + END)
            return
        if kind == "malformed_sse":
            await self._write(writer, chunk(b"data: {not json\n\nevent: ???\ndata\n\n: c\n\n\xff\xfe\n\n"))
            await self._write(writer, chunk(b"data: [DONE]\n\n") + END)
            return
        if kind == "big":
            await self._write(writer, chunk(event(0, 10 * 1024 * 1024)))
            await self._write(writer, chunk(b"data: [DONE]\n\n") + END)
            return
        n = after if kind in ("reset_after", "cut_after", "hang_after") else int(drill.get("chunks", 3))
        for i in range(n):
            await self._write(writer, chunk(event(i)))
        if kind == "reset_after":
            rst(writer)
        elif kind == "cut_after":
            writer.close()  # a clean FIN in the middle of a chunked body
        elif kind == "hang_after":
            await reader.read()
        else:
            await self._write(writer, chunk(b"data: [DONE]\n\n") + END)


class Firstbyte:
    """``firstbyte serve`` in a subprocess, its stderr in a file, its fds and RSS from /proc."""

    def __init__(self, tmp: Path, upstream: str, nofile: int | None = None) -> None:
        self.tmp = tmp
        self.nofile = nofile  # RLIMIT_NOFILE for the process (soft and hard), to drill fd exhaustion
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        timeouts = {"connect": 1, "first_chunk": 0.5, "idle": 0.5, "total": 60}
        providers = {name: {"kind": "openai", "base_url": upstream, "timeouts": timeouts}
                     for name in ("fault", "steady")}
        providers["fault"]["api_key_env"] = "DRILL_KEY"
        providers["brief"] = {"kind": "openai", "base_url": upstream, "timeouts": {**timeouts, "total": 1.5}}
        cooldown = {"failures": 1_000_000, "secs": 0.001}  # the drill wants every fault to reach the upstream
        config = {
            "listen": f"127.0.0.1:{self.port}",
            "access_log": {"format": "text", "path": str(tmp / "access.log")},
            "shutdown_grace": 1,
            "providers": providers,
            "routes": {
                "solo": {"strategy": "ordered", "targets": [{"provider": "fault", "model": "m"}],
                         "cooldown": cooldown},
                "pool": {"strategy": "ordered", "cooldown": cooldown,
                         "targets": [{"provider": "fault", "model": "m"}, {"provider": "steady", "model": "ok"}]},
                "brief": {"strategy": "ordered", "targets": [{"provider": "brief", "model": "m"}],
                          "cooldown": cooldown},
            },
            "connections": {"header_timeout": 1, "body_timeout": 2, "send_timeout": SEND_TIMEOUT,
                            "max": CONNECTIONS_MAX},
        }
        (tmp / "routes.json").write_bytes(orjson.dumps(config))
        self.log = tmp / "firstbyte.log"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> Firstbyte:
        with self.log.open("wb") as log:
            nofile = self.nofile

            def limit() -> None:
                if nofile is not None:
                    import resource

                    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; from proxy.cli import main; sys.exit(main())",
                 "serve", "--config", str(self.tmp / "routes.json")],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "DRILL_KEY": KEY},
                preexec_fn=limit if nofile is not None else None)
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.url + "/healthz") as resp:
                        if resp.status == 200:
                            return self
                assert self.proc.poll() is None, self.log.read_text()
                await asyncio.sleep(0.05)
        raise AssertionError("firstbyte never became healthy")

    def fds(self) -> int:
        assert self.proc is not None
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> str:
        """Stop it (SIGTERM, graceful) and return what it logged."""
        return stop_process(self.proc, self.log)


@pytest.fixture
async def drill(tmp_path: Path) -> AsyncIterator[tuple[FaultUpstream, Firstbyte]]:
    for kind in ("gzip_endless", "gzip_noend"):
        gzip_pieces(kind)  # made once per process, before any call: a first chunk must not wait for it
    up = await FaultUpstream().start()
    fb = await Firstbyte(tmp_path, up.url).start()
    try:
        yield up, fb
    finally:
        log = fb.stop()
        await up.stop()
    bad = [word for word in FORBIDDEN if word in log]
    record(f"firstbyte log after the test: {len(log.splitlines())} lines, "
           f"unhandled-exception markers: {bad or 'none'}")
    assert not bad, f"firstbyte logged {bad}:\n{log[-4000:]}"
    access = (tmp_path / "access.log").read_text(errors="replace") if (tmp_path / "access.log").exists() else ""
    assert KEY not in log and KEY not in access, "the provider's key reached firstbyte's log"


def body(route: str, kind: str, stream: bool, **drill: Any) -> bytes:
    return orjson.dumps({"model": route, "messages": [{"role": "user", "content": "hi"}],
                         "stream": stream, "drill": {"kind": kind, **drill}})


def verdict(status: int, data: bytes, stream: bool) -> str:
    """What the client got: ``answer``, ``error event`` (a stream cut after commit) or ``error``.

    Anything else (a 200 that is neither a complete answer nor ends in an error
    event; an error that is not the OpenAI shape) fails the drill.
    """
    assert KEY.encode() not in data, data[:300]
    if status >= 400:
        err = orjson.loads(data)["error"]
        assert isinstance(err["message"], str) and err["message"], data[:300]
        assert {"type", "param", "code"} <= set(err), data[:300]
        return "error"
    assert status == 200, status
    if not stream:
        assert orjson.loads(data)["choices"], data[:300]
        return "answer"
    events = [e for e in data.split(b"\n\n") if e.strip()]
    if events and events[-1] == b"data: [DONE]":
        return "answer"
    last = orjson.loads(events[-1].removeprefix(b"data: "))
    assert isinstance(last["error"]["message"], str), events[-1][:300]
    return "error event"


def check_headers(resp: aiohttp.ClientResponse) -> None:
    """Our headers are ours: one x-route-decision (never the upstream's forgery), no upstream cookie."""
    decisions = resp.headers.getall("x-route-decision", [])
    assert len(decisions) <= 1 and b"forged" not in b"".join(v.encode() for v in decisions), decisions
    assert resp.headers.getall("x-request-id", ["-"]) != ["forged"] and "set-cookie" not in resp.headers


async def call(session: aiohttp.ClientSession, url: str, data: bytes, stream: bool) -> str:
    async with session.post(url + "/v1/chat/completions", data=data,
                            headers={"content-type": "application/json"}) as resp:
        check_headers(resp)
        return verdict(resp.status, await resp.read(), stream)


async def settle(fb: Firstbyte, up: FaultUpstream, fds: int, secs: float = 5.0) -> None:
    """Wait (bounded) for firstbyte's fds and the upstream's connections to come back down."""
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline and (fb.fds() > fds + FD_TOLERANCE or up.open):
        await asyncio.sleep(0.1)


EXPECTED = {  # (route, kind, stream) -> verdict; "pool" fails over to a steady target before commit
    ("solo", "ok", True): "answer", ("solo", "ok", False): "answer",
    ("solo", "hang", True): "error", ("pool", "hang", True): "answer",
    ("solo", "reset_before", True): "error", ("pool", "reset_before", False): "answer",
    ("solo", "reset_after", True): "error event", ("solo", "cut_after", True): "error event",
    # Malformed events before any content: a failure before the first token (docs/adr/0007).
    ("solo", "hang_after", True): "error event", ("solo", "malformed_sse", True): "error",
    ("pool", "malformed_sse", True): "answer",
    ("solo", "garbage", True): "error", ("pool", "garbage", False): "answer",
    ("solo", "status500", False): "error", ("pool", "status500", True): "answer",
    ("solo", "status400", True): "error", ("pool", "status400", True): "error",
    ("solo", "big", True): "answer",
}
# Hostile upstreams. An event with no end is cut as "stream too large": an error event once committed;
# a failover before commit (an error on solo) where the walker holds events back before its commit.
HOSTILE: dict[tuple[str, str, bool], tuple[str, ...]] = {
    # A 401 quoting the key: the provider's auth failure, which fails over (docs/adr/0013); alone, a 502.
    ("solo", "echo_key", False): ("error",), ("pool", "echo_key", True): ("answer",),
    ("solo", "notjson", False): ("error",), ("pool", "notjson", False): ("answer",),
    ("solo", "forged_headers", False): ("answer",), ("solo", "forged_headers", True): ("answer",),
    ("solo", "string_usage", True): ("answer",),
    ("solo", "noend", True): ("error event", "error"), ("solo", "gzip_noend", True): ("error event", "error"),
    ("brief", "gzip_endless", True): ("error event",),
}


@pytest.mark.timeout(30)
async def test_each_fault_alone(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    up, fb = drill
    async with aiohttp.ClientSession() as session:
        for (route, kind, stream), want in EXPECTED.items():
            got = await call(session, fb.url, body(route, kind, stream), stream)
            assert got == want, (route, kind, stream)
        for (route, kind, stream), allowed in HOSTILE.items():
            got = await call(session, fb.url, body(route, kind, stream), stream)
            assert got in allowed, (route, kind, stream, got)
        # An endless stream: the client reads a while, then leaves; the upstream call must end too.
        async with session.post(fb.url + "/v1/chat/completions", data=body("solo", "endless", True)) as resp:
            for _ in range(50):
                await resp.content.readany()
    await settle(fb, up, 0, 3.0)
    assert up.open == 0, "an upstream call outlived its client"


_PROBE = r"""
import select, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
times = []
conn = socket.create_connection((host, port))
while not select.select([sys.stdin], [], [], 0)[0]:  # until the drill closes our stdin
    t0 = time.monotonic()
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    seen = b""
    while b'"alive"}' not in seen:
        data = conn.recv(65536)
        assert data, "firstbyte closed the probe's connection"
        seen += data
    times.append(time.monotonic() - t0)
    if len(times) == 1:
        print("ready", flush=True)  # the drill starts its fault once the probe is asking
    time.sleep(0.02)
times.sort()
print(times[-1], times[int(len(times) * 0.99)] if times else 0.0, len(times))
"""


class HealthProbe:
    """Asks ``/healthz`` every 20 ms from a process of its own (so the drill's own busy loop is not
    what it measures) on one kept-alive connection, and reports the slowest answer."""

    def __init__(self, url: str) -> None:
        self.host, _, port = url.removeprefix("http://").partition(":")
        self.port = port
        self.worst = 0.0
        self.p99 = 0.0
        self.asked = 0
        self._proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> HealthProbe:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _PROBE, self.host, self.port,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert self._proc.stdout is not None
        # A loaded machine can take longer to start the probe than a fault takes to run: wait for its first ask.
        ready = await asyncio.wait_for(self._proc.stdout.readline(), 10)
        assert ready == b"ready\n", ready
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.close()
        out, _ = await asyncio.wait_for(self._proc.communicate(), 10)
        assert self._proc.returncode == 0, "the /healthz probe failed"
        worst, p99, asked = out.split()
        self.worst, self.p99, self.asked = float(worst), float(p99), int(asked)


# /healthz answers within HEALTHZ_LIMIT while one hostile stream runs (every ask). Under the soak, whose 48
# clients saturate a 2-core machine, an ask also waits for the CPU: on a quiet machine the soak's slowest
# ask measured 49-99 ms, with other work on the machine the soak without any hostile input measured p99
# 120 ms and worst 180-730 ms. So the soak holds 99 % of asks to SOAK_P99 and every ask to HEALTHZ_WORST,
# which a freeze (seconds, before: /healthz timed out) cannot meet.
HEALTHZ_LIMIT = 0.1
RUNS = 2  # a one-stream latency run that misses HEALTHZ_LIMIT is repeated once (README: a shared machine's
# single run can miss what the code meets); every run's answer, deadline and memory are still checked, and
# before issue 14 every run missed by seconds
SOAK_P99 = 0.25
HEALTHZ_WORST = 1.5


async def read_all(session: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, bytes]:
    async with session.post(url + "/v1/chat/completions", data=data) as resp:
        return resp.status, await resp.read()


@pytest.mark.timeout(40)
@pytest.mark.parametrize("kind", ["noend", "gzip_noend"])
async def test_an_event_with_no_end_is_cut_without_freezing_the_proxy(drill: tuple[FaultUpstream, Firstbyte],
                                                                       kind: str) -> None:
    """Bytes without a blank line, plain or as a gzip stream that inflates a thousandfold: cut as
    "stream too large" at 16 MiB, while /healthz keeps answering and memory stays bounded."""
    up, fb = drill
    worst = []
    for _ in range(RUNS):
        rss0, peak = fb.rss_mb(), 0.0

        async def watch_rss() -> None:
            nonlocal peak
            while True:
                peak = max(peak, fb.rss_mb())
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch_rss())
        async with HealthProbe(fb.url) as probe, aiohttp.ClientSession() as session:
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            status, data = await read_all(session, fb.url, body("solo", kind, True))
            took = time.monotonic() - t0
        watcher.cancel()
        got = verdict(status, data, True)
        record(f"{kind}: {got} after {took:.2f} s ({status}); /healthz worst {probe.worst * 1000:.0f} ms over "
               f"{probe.asked} asks; RSS {rss0:.1f} -> peak {peak:.1f} MB")
        assert got in ("error event", "error")
        assert b"stream too large" in data
        assert took < 10
        assert peak - rss0 < 120, "the pending event was held more than once"
        await settle(fb, up, 0, 3.0)
        assert up.open == 0
        worst.append(probe.worst)
        if probe.worst < HEALTHZ_LIMIT:
            break
    assert min(worst) < HEALTHZ_LIMIT, worst


@pytest.mark.timeout(30)
async def test_a_busy_compressed_stream_still_meets_its_total_deadline(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    """Valid events, endless, gzip-compressed: the reads never wait for the socket, yet the 1.5 s total
    deadline ends the client's stream and /healthz answers throughout."""
    up, fb = drill
    gzip_pieces("gzip_endless")  # made before the call: the first chunk must not wait for it
    worst = []
    for _ in range(RUNS):
        async with HealthProbe(fb.url) as probe, aiohttp.ClientSession() as session:
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            status, data = await read_all(session, fb.url, body("brief", "gzip_endless", True))
            took = time.monotonic() - t0
        record(f"busy gzip stream: ended after {took:.2f} s with {len(data) / 2**20:.0f} MB relayed; "
               f"/healthz worst {probe.worst * 1000:.0f} ms over {probe.asked} asks")
        assert verdict(status, data, True) == "error event"
        assert b"total timeout" in data.rsplit(b"\n\n", 2)[-2]
        assert 1.5 <= took < 3.5
        worst.append(probe.worst)
        if probe.worst < HEALTHZ_LIMIT:
            break
    assert min(worst) < HEALTHZ_LIMIT, worst


@pytest.mark.timeout(40)
async def test_idle_connections_cannot_exhaust_descriptors(tmp_path: Path) -> None:
    """Under RLIMIT_NOFILE 256, 400 connections that never finish a request head: a real request still
    gets an answer (a 503 in the OpenAI shape at worst, never an empty reply), and once the head
    deadline cuts the idle ones, it is served."""
    up = await FaultUpstream().start()
    fb = await Firstbyte(tmp_path, up.url, nofile=256).start()
    idle: list[asyncio.StreamWriter] = []
    try:
        for _ in range(400):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", fb.port)
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never the rest
                idle.append(writer)
        await asyncio.sleep(0.2)
        fds = fb.fds()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            status, data = await read_all(session, fb.url, body("solo", "ok", False))
            first = verdict(status, data, False)
            await asyncio.sleep(1.5)  # past connections.header_timeout (1 s)
            status, data = await read_all(session, fb.url, body("solo", "ok", False))
            later = verdict(status, data, False)
        record(f"400 idle connections under RLIMIT_NOFILE 256: firstbyte fds {fds}; a request meanwhile: "
               f"{first}; after the head deadline: {later}")
        assert fds < 256
        assert first in ("answer", "error")
        assert later == "answer"
    finally:
        for writer in idle:
            writer.close()
        log = fb.stop()
        await up.stop()
    assert not [word for word in FORBIDDEN if word in log], log[-3000:]


@pytest.mark.timeout(30)
async def test_slow_reader_holds_the_upstream_back(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    """64 KB events as fast as the proxy takes them, a client reading ~400 KB/s: backpressure, not buffering."""
    up, fb = drill
    rss0 = fb.rss_mb()
    reader, writer = await asyncio.open_connection("127.0.0.1", fb.port)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    payload = body("solo", "endless", True, size=65536, pause=0)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    received, peak_gap, peak_rss = 0, 0, rss0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:
        received += len(await reader.read(8192))
        await asyncio.sleep(0.02)
        peak_gap = max(peak_gap, up.sent - received)
        peak_rss = max(peak_rss, fb.rss_mb())
    rst(writer)
    record(f"slow reader: client read {received / 2**20:.1f} MB in 3 s; upstream wrote {up.sent / 2**20:.1f} MB; "
           f"most in flight {peak_gap / 2**20:.1f} MB; firstbyte RSS {rss0:.1f} -> peak {peak_rss:.1f} MB")
    # Without backpressure the upstream would push gigabytes over loopback in 3 s.
    assert peak_gap < 24 * 2**20, "the proxy buffered instead of holding the upstream back"
    assert peak_rss - rss0 < 24, "firstbyte's memory grew with the slow reader"
    await settle(fb, up, 0, 3.0)
    assert up.open == 0


@pytest.mark.timeout(60)
async def test_thousands_of_clients_leave_mid_stream(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    """2,000 clients each read the first chunk of an endless stream and hang up; nothing may leak."""
    up, fb = drill
    async with aiohttp.ClientSession() as session:  # warm-up: lazy imports and pools exist before the baseline
        for _ in range(20):
            await call(session, fb.url, body("solo", "ok", True), True)
    await asyncio.sleep(0.3)
    fds0, rss0 = fb.fds(), fb.rss_mb()

    refused = 0  # answered with an error before streaming (a first chunk over 0.5 s on a loaded machine)
    why: Counter[str] = Counter()

    async def leave(i: int) -> None:
        nonlocal refused
        reader, writer = await asyncio.open_connection("127.0.0.1", fb.port)
        try:
            payload = body("solo", "endless", True, pause=0.01)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
            try:
                status = await asyncio.wait_for(reader.readline(), 20)
                if b" 200 " not in status:  # an OpenAI-shape error; the connection stays open
                    refused += 1
                    why[status.strip().decode(errors="replace")[:40] or "closed"] += 1
                    return
                await asyncio.wait_for(reader.readuntil(b"data: "), 20)
            except asyncio.IncompleteReadError:
                refused += 1
                why["cut before streaming"] += 1
        finally:
            if i % 2:
                rst(writer)  # half reset, half close politely
            else:
                writer.close()

    peak = 0
    for wave in range(10):
        await asyncio.gather(*(leave(wave * 200 + i) for i in range(200)))
        peak = max(peak, fb.fds())
    await settle(fb, up, fds0)
    fds1, rss1 = fb.fds(), fb.rss_mb()
    async with aiohttp.ClientSession() as session, session.get(fb.url + "/v1/health") as resp:
        in_flight = sum(t["in_flight"] for t in (await resp.json())["targets"])
    record(f"2000 clients left mid-stream ({refused} got an error before streaming{': ' if why else ''}"
           f"{', '.join(f'{k} {v}' for k, v in why.items())}): "
           f"firstbyte fds {fds0} -> peak {peak} -> {fds1}; "
           f"RSS {rss0:.1f} -> {rss1:.1f} MB; upstream connections open {up.open}; in flight {in_flight}")
    assert refused <= 100, "most clients must have been streaming when they left"
    assert up.open == 0, "upstream connections outlived their clients"
    assert in_flight == 0
    assert fds1 <= fds0 + FD_TOLERANCE


# Issue 31's upstream attacks in the soak: an endless 103 flood, and answers repeated unasked (every soak
# answer carries its own echo token, so one that reached the wrong client fails the soak).
SOAK_UPSTREAM_ATTACKS = {"interim_flood": 1, "stray": 3}

SOAK_KINDS = {  # kind -> weight
    "ok": 50, "hang": 2, "reset_before": 6, "reset_after": 6, "cut_after": 6, "hang_after": 2,
    "malformed_sse": 4, "garbage": 5, "status500": 6, "status400": 3, "endless": 3, "big": 0.1,
    # hostile upstreams
    "echo_key": 2, "notjson": 2, "forged_headers": 2, "string_usage": 2, "noend": 0.03, "gzip_noend": 0.05,
    "gzip_endless": 0.03,
    # hostile clients (c_*): a gzip bomb, a body that is not gzip, JSON 300 deep, a forged model, CL with TE
    # and a head trickled past the header timeout, all over the same listener
    "c_gzip_bomb": 0.5, "c_bad_gzip": 1, "c_deep_json": 1, "c_forged_model": 1, "c_cl_te": 1, "c_slowloris": 0.3,
    **SOAK_UPSTREAM_ATTACKS,
}
SOAK_REQUESTS = 10_000
SOAK_WARM_UP = 2_000  # requests of the same mix before the soak's baseline (test_soak_of_random_faults says why)
STREAMED_KINDS = ("endless", "big", "malformed_sse", "noend", "gzip_noend", "gzip_endless", "string_usage")


def _gzip(data: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    return packer.compress(data) + packer.flush()


GZIP_BOMB = _gzip(b'{"model": "solo", "messages": [], "pad": "' + b" " * (8 * 2**20) + b'"}')  # 8 MiB > 4 MiB
DEEP_JSON = b'{"model": "solo", "messages": [], "x": ' + b"[" * 300 + b"]" * 300 + b"}"


async def soak_call(session: aiohttp.ClientSession, url: str, route: str, kind: str, stream: bool,
                    leaves: bool, rng: random.Random) -> str:
    """One soak request to a (maybe faulty) upstream: its verdict, or "client left". Each carries its own
    echo token, so an answer that reached the wrong client fails the soak (``no_wrong_answer``)."""
    token = f"{rng.getrandbits(64):016x}"
    data = body(route, kind, stream, after=rng.randint(0, 4), chunks=rng.randint(1, 8), echo=token)
    async with session.post(url + "/v1/chat/completions", data=data,
                            headers={"content-type": "application/json"}) as resp:
        check_headers(resp)
        if leaves:
            for _ in range(rng.randint(0, 5)):
                if not await resp.content.readany():
                    break
            resp.close()
            return "client left"
        answer = await resp.read()
        no_wrong_answer(answer, token)
        return verdict(resp.status, answer, stream)


async def raw_answer(port: int, data: bytes, secs: float = 5.0) -> tuple[int, bytes]:
    """Send ``data`` on a socket of its own and read until firstbyte closes: (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        raw = await asyncio.wait_for(reader.read(), secs)
    finally:
        writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


async def hostile_client(session: aiohttp.ClientSession, fb: Firstbyte, kind: str) -> str:
    """A client-side hostile input: each must end in an OpenAI-shape error (or a 408 for the slow one)."""
    url = fb.url + "/v1/chat/completions"
    if kind in ("c_cl_te", "c_slowloris"):
        if kind == "c_cl_te":
            data = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        else:
            data = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"  # and then nothing
        status, rest = await raw_answer(fb.port, data)
        assert status == (408 if kind == "c_slowloris" else 400), (kind, status, rest[:200])
        return verdict(status, rest, False)
    headers = {"content-type": "application/json"}
    if kind == "c_gzip_bomb":
        data, headers["content-encoding"] = GZIP_BOMB, "gzip"
    elif kind == "c_bad_gzip":
        data, headers["content-encoding"] = b"certainly not gzip", "gzip"
    elif kind == "c_deep_json":
        data = DEEP_JSON
    else:
        data = orjson.dumps({"model": "solo; served=evil\r\nx-forged: 1", "messages": []})
    async with session.post(url, data=data, headers=headers) as resp:
        assert resp.status in (400, 413), (kind, resp.status)
        check_headers(resp)
        return verdict(resp.status, await resp.read(), False)


async def non_reading_client(port: int) -> str:
    """Asks for an endless stream of 64 KB events on a socket with a 4 KB receive buffer and reads
    nothing for a while: firstbyte must have cut it (a reset) by then, freeing the upstream call.
    ``held`` (it was still streaming when read) fails the soak; an error before any byte streamed
    (a first chunk late on a loaded machine) is ``refused``."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window it offers
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        payload = body("solo", "endless", True, size=65536, pause=0)
        await loop.sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                      b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
        await asyncio.sleep(2 * SEND_TIMEOUT + 1)  # not reading: buffers fill, then the send timeout runs
        head = b""
        deadline = loop.time() + 3
        while (left := deadline - loop.time()) > 0:
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, 65536), left)
            except ConnectionResetError:
                return "cut"
            except TimeoutError:
                break
            if not data:
                return "cut"
            head = head or data[:16]
        return "held" if head.startswith(b"HTTP/1.1 200") else "refused"
    finally:
        sock.close()


async def ask_healthz(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> str:
    """One GET /healthz on a kept-alive connection: ``served``, ``busy`` (a 503: locked out) or
    ``evicted`` (firstbyte had closed it, idle, for a newcomer)."""
    reader, writer = conn
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.readuntil(b"}"), 5)
    except (ConnectionError, asyncio.IncompleteReadError):
        return "evicted"
    return "served" if answer.startswith(b"HTTP/1.1 200") else "busy"


class ClientAttacks:
    """Issue 31's client-side attacks, beside the soak: two clients at a time that stop reading an
    endless stream (two such held a ``max_concurrent: 2`` provider for good), and keep-alive
    connections past ``connections.max`` that idle between /healthz asks, each asking again every
    few seconds (200 such locked every new client out with 503s). Every non-reader must be cut,
    every ask on a new connection served."""

    FILL = CONNECTIONS_MAX + 16
    ASK_EVERY = 12.0  # seconds between two asks on one idle connection (as in issue 31)

    def __init__(self, port: int) -> None:
        self.port = port
        self.outcomes: Counter[str] = Counter()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ClientAttacks:
        self._tasks = [asyncio.create_task(self._non_readers()) for _ in range(2)]
        self._tasks.append(asyncio.create_task(self._idle_fill()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _non_readers(self) -> None:
        while not self._stop.is_set():
            self.outcomes[f"non-reader {await non_reading_client(self.port)}"] += 1

    async def _idle_fill(self) -> None:
        conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            while not self._stop.is_set():
                while len(conns) < self.FILL and not self._stop.is_set():  # top up: each a newcomer
                    conn = await asyncio.open_connection("127.0.0.1", self.port)
                    got = await ask_healthz(conn)
                    self.outcomes[f"idle fill newcomer {got}"] += 1
                    if got == "served":
                        conns.append(conn)
                    else:
                        conn[1].close()
                for conn in list(conns):  # each asks again (oldest first), spread over ASK_EVERY
                    if self._stop.is_set():
                        break
                    got = await ask_healthz(conn)
                    self.outcomes[f"idle fill {got}"] += 1
                    if got != "served":
                        conns.remove(conn)
                        conn[1].close()
                    await asyncio.sleep(self.ASK_EVERY / self.FILL)
        finally:
            for _, writer in conns:
                writer.close()

    def check(self) -> None:
        """Every non-reader was cut; no newcomer of the fill met a 503; evictions did happen."""
        got = self.outcomes
        record("client attacks beside the soak: " + ", ".join(f"{k} {v}" for k, v in sorted(got.items())))
        assert got["non-reader held"] == 0, "a client that stopped reading kept its stream"
        assert got["non-reader cut"] >= 4
        assert got["idle fill newcomer busy"] == 0 and got["idle fill busy"] == 0, "idle connections locked clients out"
        assert got["idle fill evicted"] > 0


@pytest.mark.timeout(240)  # a runaway bound, not a goal: 78-158 s at load average 7-15 on the shared 2-core box
async def test_soak_of_random_faults(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    """10,000 requests, random faults at random moments, random client departures: nothing leaks."""
    up, fb = drill
    rng = random.Random(6)
    kinds, weights = list(SOAK_KINDS), list(SOAK_KINDS.values())
    injected: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    gzip_pieces("gzip_endless")
    gzip_pieces("gzip_noend")
    fds_start, rss_start = fb.fds(), fb.rss_mb()

    async def one(session: aiohttp.ClientSession) -> None:
        kind = rng.choices(kinds, weights)[0]
        route = "brief" if kind == "gzip_endless" else rng.choice(("solo", "pool"))
        stream = kind in STREAMED_KINDS or rng.random() < 0.7
        # the client hangs up at a random moment; an endless stream's always does (the busy gzip one's
        # total deadline is the drill's own test, where it is read to its end)
        leaves = kind in ("endless", "gzip_endless") or rng.random() < 0.05
        injected[kind] += 1
        if kind.startswith("c_"):
            outcomes[await hostile_client(session, fb, kind)] += 1
            return
        outcomes[await soak_call(session, fb.url, route, kind, stream, leaves, rng)] += 1

    async def soak(requests: int) -> None:
        """``requests`` calls from 48 clients on one session, closed before it returns."""
        queue = list(range(requests))

        async def worker() -> None:
            while queue:
                queue.pop()
                await one(session)

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*(worker() for _ in range(48)))

    async with aiohttp.ClientSession() as session:
        for kind in kinds:  # every path once, so a fault the warm-up draws rarely has loaded what it needs
            if kind.startswith("c_"):
                await hostile_client(session, fb, kind)
            elif kind not in ("endless", "big", "gzip_endless", "noend"):
                await call(session, fb.url, body("pool", kind, True), True)
    # The baseline is read after a warm-up of the same mix, its clients gone, as the end is. Read inside
    # the process over 60,000 soak requests (gc, mallinfo2, pymalloc's stats, tracemalloc), nothing is
    # retained: after a collection the live objects (~1,900) and malloc's bytes in use (9.3 MB) are flat
    # from the first 10,000 on, and the tracker's bounded windows are what grows early. RSS still moves
    # by -2 to +6 MB a round: pymalloc's arenas grow early and stay, cyclic garbage waits for the
    # collector (service.GC_THRESHOLDS), glibc keeps freed heap after the 10 MB events (malloc_trim
    # gives 8-10 MB back). From a baseline before the warm-up that made +6 to +16.5 MB (the flake);
    # from after it, -0.1 to +8.7 MB; a scratch run keeping 2 KiB per read the server takes, +60 MB.
    # Later runs read +11 to +17.5 MB (a CI failure): in-process, live memory stayed at 13 MB while glibc's
    # heap held 12 MB free, pinned between live blocks, flat over three more rounds; memory.py's threshold
    # now sends those blocks to mmap (+5 MB).
    async with ClientAttacks(fb.port):  # the warm-up's mix has them too: their allocations are in the baseline
        await soak(SOAK_WARM_UP)
    await settle(fb, up, fds_start)
    await asyncio.sleep(0.5)
    fds0, rss0 = fb.fds(), fb.rss_mb()
    t0 = time.monotonic()
    async with HealthProbe(fb.url) as probe, ClientAttacks(fb.port) as attacks:
        await soak(SOAK_REQUESTS)
    took = time.monotonic() - t0
    attacks.check()
    await settle(fb, up, fds0)
    await asyncio.sleep(0.5)
    fds1, rss1 = fb.fds(), fb.rss_mb()
    record(f"soak: {SOAK_REQUESTS} requests in {took:.1f} s after {SOAK_WARM_UP} to warm up; faults injected in all "
           + ", ".join(f"{k} {v}" for k, v in injected.most_common()))
    record("soak outcomes: " + ", ".join(f"{k} {v}" for k, v in outcomes.most_common()))
    record(f"soak: firstbyte fds {fds0} -> {fds1} (tolerance +{FD_TOLERANCE}); "
           f"RSS {rss_start:.1f} -> {rss0:.1f} after the warm-up -> {rss1:.1f} MB (tolerance +{RSS_TOLERANCE_MB:g} MB "
           f"from after the warm-up); upstream open {up.open}")
    record(f"soak: /healthz p99 {probe.p99 * 1000:.0f} ms, worst {probe.worst * 1000:.0f} ms over "
           f"{probe.asked} asks (limits {SOAK_P99 * 1000:.0f} ms and {HEALTHZ_WORST * 1000:.0f} ms)")
    assert sum(outcomes.values()) == SOAK_WARM_UP + SOAK_REQUESTS
    assert probe.p99 < SOAK_P99, "firstbyte's loop stalls under the soak"
    assert probe.worst < HEALTHZ_WORST, "firstbyte froze"
    assert up.open == 0
    assert fds1 <= fds0 + FD_TOLERANCE
    assert rss1 - rss0 <= RSS_TOLERANCE_MB


# --- issue 31: interim floods and unasked answers, each alone ---------------------------------------

FLOOD_P99 = 0.2  # /healthz while interim floods are in flight (issue 31: under 200 ms p99)


@pytest.mark.timeout(40)
async def test_interim_floods_in_flight_keep_healthz_fast_and_fail_over(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    """Four clients call an upstream that floods 103 Early Hints, one call after another for 3 s: each
    call fails over to the steady target with "interim flood" in its decision, and /healthz keeps
    answering (before: each flood held the loop until the first-chunk deadline)."""
    up, fb = drill
    got: Counter[str] = Counter()
    slowest = 0.0
    async with HealthProbe(fb.url) as probe, aiohttp.ClientSession() as session:
        await asyncio.sleep(0.1)
        t0 = time.monotonic()

        async def flooded() -> None:
            nonlocal slowest
            while time.monotonic() - t0 < 3.0:
                started = time.monotonic()
                async with session.post(fb.url + "/v1/chat/completions",
                                        data=body("pool", "interim_flood", False)) as resp:
                    data = await resp.read()
                    decision = resp.headers.get("x-route-decision", "")
                slowest = max(slowest, time.monotonic() - started)
                got[verdict(resp.status, data, False)] += 1
                assert "interim flood" in decision, decision

        await asyncio.gather(*(flooded() for _ in range(4)))
    record(f"interim floods: {sum(got.values())} flooded calls from 4 clients in 3 s ({dict(got)}), slowest "
           f"{slowest * 1000:.0f} ms; /healthz p99 {probe.p99 * 1000:.0f} ms, worst {probe.worst * 1000:.0f} ms "
           f"over {probe.asked} asks")
    assert got == Counter({"answer": sum(got.values())})
    assert slowest < 0.5, "a flooded call waited for its first-chunk deadline"
    assert probe.p99 < FLOOD_P99, "interim floods stall firstbyte's loop"
    await settle(fb, up, 0, 3.0)
    assert up.open == 0


@pytest.mark.timeout(40)
async def test_answers_repeated_unasked_never_reach_another_client(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    """An upstream repeats each answer 20 ms later, unasked. One client calls; then three call at once,
    right before the repeat and right after it: each must get its own echo, never another's."""
    up, fb = drill
    rng = random.Random(31)
    answered = 0
    async with aiohttp.ClientSession() as session:

        async def ask() -> None:
            nonlocal answered
            status = await soak_call(session, fb.url, "solo", "stray", rng.random() < 0.5, False, rng)
            answered += status == "answer"

        for n in range(20):
            await ask()
            await asyncio.sleep(0.025 if n % 2 else 0.0)
            await asyncio.gather(ask(), ask(), ask())
    record(f"answers repeated unasked: {answered} of 80 calls answered, none with another's answer")
    assert answered == 80
    await settle(fb, up, 0, 3.0)
