"""The fault drill: firstbyte as deployed (``firstbyte serve`` in a subprocess) against an upstream that misbehaves.

A raw TCP upstream speaks HTTP by hand so it can hang, reset before or after
the headers, cut a chunked body, send malformed SSE, garbage bytes, a 10 MB
chunk or an endless stream; the request body's ``drill`` field picks the fault.
The drill checks that every answer is either valid or an OpenAI-shape error,
that a slow reader holds the upstream back instead of filling firstbyte's
memory, that clients leaving by the thousand release every upstream
connection, and that a 10,000-request soak of random faults leaves no
traceback in firstbyte's log and its open fds and RSS back at baseline
(read from ``/proc/PID``). Its figures go to ``bench-results/fault-drill.txt``
and to the pytest terminal summary.

Bounded: each test has a timeout, the whole drill takes well under 90 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "bench-results" / "fault-drill.txt"
FIGURES: list[str] = []  # printed by conftest's terminal summary hook and written to REPORT
FORBIDDEN = ("Traceback", "Error handling request", "Task exception was never retrieved",
             "Unclosed", "Exception in callback")
FD_TOLERANCE = 2  # open fds after the drill: at most this many above baseline
RSS_TOLERANCE_MB = 16.0  # resident memory after the soak: at most this much above baseline

HEAD_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
END = b"0\r\n\r\n"


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
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = orjson.loads(await reader.readexactly(length))
            drill = body.get("drill") or {}
            kind = "ok" if body.get("model") == "ok" else drill.get("kind", "ok")
            await self._fault(kind, drill, bool(body.get("stream")), reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, orjson.JSONDecodeError):
            pass
        finally:
            self.open -= 1
            writer.close()

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
        elif kind == "status400":
            await self._write(writer, http(400, b'{"error": {"message": "bad", "type": "invalid_request_error",'
                                                b' "param": null, "code": null}}'))
        elif not stream:
            await self._write(writer, http(200, orjson.dumps({
                "id": "x", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}]})))
        else:
            await self._write(writer, HEAD_SSE)
            await self._stream(kind, drill, after, reader, writer)

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

    def __init__(self, tmp: Path, upstream: str) -> None:
        self.tmp = tmp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        timeouts = {"connect": 1, "first_chunk": 0.5, "idle": 0.5, "total": 60}
        providers = {name: {"kind": "openai", "base_url": upstream, "timeouts": timeouts}
                     for name in ("fault", "steady")}
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
            },
        }
        (tmp / "routes.json").write_bytes(orjson.dumps(config))
        self.log = tmp / "firstbyte.log"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> Firstbyte:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; from proxy.cli import main; sys.exit(main())",
                 "serve", "--config", str(self.tmp / "routes.json")],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text(errors="replace")


@pytest.fixture
async def drill(tmp_path: Path) -> AsyncIterator[tuple[FaultUpstream, Firstbyte]]:
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


def body(route: str, kind: str, stream: bool, **drill: Any) -> bytes:
    return orjson.dumps({"model": route, "messages": [{"role": "user", "content": "hi"}],
                         "stream": stream, "drill": {"kind": kind, **drill}})


def verdict(status: int, data: bytes, stream: bool) -> str:
    """What the client got: ``answer``, ``error event`` (a stream cut after commit) or ``error``.

    Anything else (a 200 that is neither a complete answer nor ends in an error
    event; an error that is not the OpenAI shape) fails the drill.
    """
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


async def call(session: aiohttp.ClientSession, url: str, data: bytes, stream: bool) -> str:
    async with session.post(url + "/v1/chat/completions", data=data,
                            headers={"content-type": "application/json"}) as resp:
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


@pytest.mark.timeout(30)
async def test_each_fault_alone(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    up, fb = drill
    async with aiohttp.ClientSession() as session:
        for (route, kind, stream), want in EXPECTED.items():
            got = await call(session, fb.url, body(route, kind, stream), stream)
            assert got == want, (route, kind, stream)
        # An endless stream: the client reads a while, then leaves; the upstream call must end too.
        async with session.post(fb.url + "/v1/chat/completions", data=body("solo", "endless", True)) as resp:
            for _ in range(50):
                await resp.content.readany()
    await settle(fb, up, 0, 3.0)
    assert up.open == 0, "an upstream call outlived its client"


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
                    return
                await asyncio.wait_for(reader.readuntil(b"data: "), 20)
            except asyncio.IncompleteReadError:
                refused += 1
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
    record(f"2000 clients left mid-stream ({refused} got an error before streaming): "
           f"firstbyte fds {fds0} -> peak {peak} -> {fds1}; "
           f"RSS {rss0:.1f} -> {rss1:.1f} MB; upstream connections open {up.open}; in flight {in_flight}")
    assert refused <= 100, "most clients must have been streaming when they left"
    assert up.open == 0, "upstream connections outlived their clients"
    assert in_flight == 0
    assert fds1 <= fds0 + FD_TOLERANCE


SOAK_KINDS = {  # kind -> weight
    "ok": 50, "hang": 2, "reset_before": 6, "reset_after": 6, "cut_after": 6, "hang_after": 2,
    "malformed_sse": 4, "garbage": 5, "status500": 6, "status400": 3, "endless": 3, "big": 0.1,
}
SOAK_REQUESTS = 10_000


@pytest.mark.timeout(80)
async def test_soak_of_random_faults(drill: tuple[FaultUpstream, Firstbyte]) -> None:
    """10,000 requests, random faults at random moments, random client departures: nothing leaks."""
    up, fb = drill
    rng = random.Random(6)
    kinds, weights = list(SOAK_KINDS), list(SOAK_KINDS.values())
    injected: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for kind in kinds:  # warm-up: every path once, so the baseline includes what they load
            if kind not in ("endless", "big"):
                await call(session, fb.url, body("pool", kind, True), True)
        await asyncio.sleep(0.3)
        fds0, rss0 = fb.fds(), fb.rss_mb()
        queue = list(range(SOAK_REQUESTS))

        async def one() -> None:
            kind = rng.choices(kinds, weights)[0]
            route = rng.choice(("solo", "pool"))
            stream = kind in ("endless", "big", "malformed_sse") or rng.random() < 0.7
            leaves = kind == "endless" or rng.random() < 0.05  # the client hangs up at a random moment
            injected[kind] += 1
            data = body(route, kind, stream, after=rng.randint(0, 4), chunks=rng.randint(1, 8))
            async with session.post(fb.url + "/v1/chat/completions", data=data,
                                    headers={"content-type": "application/json"}) as resp:
                if leaves:
                    for _ in range(rng.randint(0, 5)):
                        if not await resp.content.readany():
                            break
                    resp.close()
                    outcomes["client left"] += 1
                    return
                outcomes[verdict(resp.status, await resp.read(), stream)] += 1

        async def worker() -> None:
            while queue:
                queue.pop()
                await one()

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(48)))
        took = time.monotonic() - t0
    await settle(fb, up, fds0)
    await asyncio.sleep(0.5)
    fds1, rss1 = fb.fds(), fb.rss_mb()
    record(f"soak: {sum(injected.values())} requests in {took:.1f} s; faults injected "
           + ", ".join(f"{k} {v}" for k, v in injected.most_common()))
    record("soak outcomes: " + ", ".join(f"{k} {v}" for k, v in outcomes.most_common()))
    record(f"soak: firstbyte fds {fds0} -> {fds1} (tolerance +{FD_TOLERANCE}); "
           f"RSS {rss0:.1f} -> {rss1:.1f} MB (tolerance +{RSS_TOLERANCE_MB:g} MB); upstream open {up.open}")
    assert sum(outcomes.values()) == SOAK_REQUESTS
    assert up.open == 0
    assert fds1 <= fds0 + FD_TOLERANCE
    assert rss1 - rss0 <= RSS_TOLERANCE_MB
