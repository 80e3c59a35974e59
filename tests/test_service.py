"""firstbyte as systemd runs it: a real process, real signals, a real notify socket."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.routing.decision import parse_header

from .conftest import ok_handler

KEY = "client-key-123"


def sim(first_ms: float = 2, chunk_ms: float = 1, chunks: int = 4) -> dict[str, Any]:
    return {"kind": "simulated",
            "simulate": {"first_chunk_ms": first_ms, "jitter_ms": 0, "chunk_ms": chunk_ms, "chunks": chunks}}


def base_config(port: int, ops_port: int, tmp: Path, **extra: Any) -> dict[str, Any]:
    return {
        "listen": f"127.0.0.1:{port}",
        "ops_listen": f"127.0.0.1:{ops_port}",
        "clients": {"keys_env": "FIRSTBYTE_TEST_KEYS"},
        "access_log": {"format": "json", "path": str(tmp / "access.log")},
        "ledger": {"path": str(tmp / "ledger.db")},
        "shutdown_grace": 10,
        "providers": {"fast": sim(), "slow": sim(first_ms=20, chunk_ms=100, chunks=10)},
        "routes": {
            "chat": {"strategy": "ordered", "targets": [{"provider": "fast", "model": "f-1"}]},
            "slow": {"strategy": "ordered", "targets": [{"provider": "slow", "model": "s-1"}]},
        },
        **extra,
    }


class Running:
    def __init__(self, proc: asyncio.subprocess.Process, ports: tuple[int, int], notify: socket.socket,
                 config: Path) -> None:
        self.proc = proc
        self.ports = ports
        self.url = f"http://127.0.0.1:{ports[0]}"
        self.ops_url = f"http://127.0.0.1:{ports[1]}"
        self.notify = notify
        self.config = config
        self.messages: list[str] = []

    async def wait_for(self, message: str, timeout: float = 10) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while message not in self.messages:
            if loop.time() > deadline:
                raise AssertionError(f"no {message!r} from firstbyte; got {self.messages}")
            try:
                data = self.notify.recv(4096)
            except BlockingIOError:
                await asyncio.sleep(0.02)
                continue
            self.messages.extend(data.decode().splitlines())

    def headers(self, key: str | None = KEY) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}


@pytest.fixture
async def service(tmp_path: Path, unused_tcp_port_factory: Any) -> AsyncIterator[Running]:
    ports = (unused_tcp_port_factory(), unused_tcp_port_factory())
    config = tmp_path / "routes.yaml"
    config.write_text(yaml.safe_dump(base_config(*ports, tmp_path)))
    notify_path = tmp_path / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.setblocking(False)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "200000",
           "FIRSTBYTE_TEST_KEYS": f"other-key, {KEY}"}
    with (tmp_path / "stderr.log").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy.cli", "serve", "--config", str(config), env=env, stderr=stderr
        )
    running = Running(proc, ports, notify, config)
    try:
        await running.wait_for("READY=1")
        yield running
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        notify.close()


async def chat(session: aiohttp.ClientSession, svc: Running, route: str = "chat", **kw: Any) -> tuple[int, str]:
    body = {"model": route, "messages": [{"role": "user", "content": "hi"}], **kw}
    async with session.post(svc.url + "/v1/chat/completions", json=body, headers=svc.headers()) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-route-decision", "")


async def test_client_keys_guard_v1_but_not_health(service: Running) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        for headers in ({}, service.headers("wrong"), {"x-api-key": "wrong"}):
            async with s.post(service.url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 401
                error = (await resp.json())["error"]
                assert error["type"] == "authentication_error"
                assert "wrong" not in json.dumps(error)
        async with s.post(service.url + "/v1/chat/completions", json=body, headers=service.headers()) as resp:
            assert resp.status == 200
        async with s.post(service.url + "/v1/chat/completions", json=body, headers={"x-api-key": KEY}) as resp:
            assert resp.status == 200
        for path in ("/v1/models", "/v1/health", "/v1/routes/chat/explain", "/v1/no-such-endpoint"):
            async with s.get(service.url + path) as resp:  # every /v1 path, known or not, asks for a key
                assert resp.status == 401, path
            async with s.get(service.url + path, headers=service.headers()) as resp:
                assert resp.status == (404 if "no-such" in path else 200), path
        for path in ("/healthz", "/readyz", "/metrics"):
            async with s.get(service.url + path) as resp:  # /metrics asks for a key (README "Security")
                assert resp.status == (401 if path == "/metrics" else 200), path
            async with s.get(service.url + path, headers=service.headers()) as resp:
                assert resp.status == 200, path
            async with s.get(service.ops_url + path) as resp:
                assert resp.status == 200, path
        async with s.get(service.ops_url + "/v1/health") as resp:
            assert resp.status == 200  # the ops listener needs no client key
        async with s.get(service.ops_url + "/v1/routes/chat/explain") as resp:
            assert resp.status == 200 and (await resp.json())["route"] == "chat"
    await service.wait_for("WATCHDOG=1")


async def reload_gauges(session: aiohttp.ClientSession, service: Running) -> tuple[float, float]:
    """firstbyte_config_last_reload_successful and its success timestamp, from /metrics."""
    async with session.get(service.ops_url + "/metrics") as resp:
        text = await resp.text()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return (values["firstbyte_config_last_reload_successful"],
            values["firstbyte_config_last_reload_success_timestamp_seconds"])


async def test_reload_under_traffic_loses_no_request(service: Running, tmp_path: Path) -> None:
    statuses: list[int] = []
    stop = asyncio.Event()

    async def traffic(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            status, _ = await chat(session, service)
            statuses.append(status)

    async with aiohttp.ClientSession() as session:
        workers = [asyncio.create_task(traffic(session)) for _ in range(4)]
        await asyncio.sleep(0.3)
        good = base_config(*service.ports, tmp_path)
        good["routes"]["added"] = {"targets": [{"provider": "fast", "model": "f-2"}]}
        service.config.write_text(yaml.safe_dump(good))
        service.proc.send_signal(signal.SIGHUP)
        await service.wait_for("RELOADING=1")
        await asyncio.sleep(0.3)
        assert (await chat(session, service, "added"))[0] == 200
        taken = await reload_gauges(session, service)
        assert taken[0] == 1 and taken[1] > 0

        service.messages.clear()
        service.config.write_text("routes: {chat: {targets: [{provider: nope}]}}\n")
        service.proc.send_signal(signal.SIGHUP)
        await service.wait_for("RELOADING=1")
        await service.wait_for("READY=1")
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*workers)
        assert (await chat(session, service, "added"))[0] == 200  # the old config still serves
        refused = await reload_gauges(session, service)
        assert refused == (0, taken[1])  # refused shows; the timestamp is still the last taken load
    assert len(statuses) > 20
    assert set(statuses) == {200}
    stderr = (tmp_path / "stderr.log").read_text()
    assert "reload refused" in stderr
    assert "routes.chat.targets[0].model: required" in stderr
    assert "providers: required" in stderr


async def test_a_reload_that_moves_the_log_and_ledger_loses_no_line_or_row(service: Running, tmp_path: Path) -> None:
    """4 clients stream while a reload moves both the access log and the ledger: every exchange
    is a line in one of the two logs and a row in one of the two ledgers (the hub used to close
    the old ones before the gateway's observers were swapped, and exchanges in between were lost)."""
    done = 0
    stop = asyncio.Event()

    async def traffic(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while not stop.is_set():
            status, _ = await chat(session, service, stream=True)
            assert status == 200
            done += 1

    moved = base_config(*service.ports, tmp_path)
    moved["access_log"]["path"] = str(tmp_path / "access-2.log")
    moved["ledger"]["path"] = str(tmp_path / "ledger-2.db")
    async with aiohttp.ClientSession() as session:
        workers = [asyncio.create_task(traffic(session)) for _ in range(4)]
        await asyncio.sleep(0.3)
        service.config.write_text(yaml.safe_dump(moved))
        service.proc.send_signal(signal.SIGHUP)
        await service.wait_for("RELOADING=1")
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*workers)
    service.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(service.proc.wait(), 15) == 0
    lines = [json.loads(line) for name in ("access.log", "access-2.log")
             for line in (tmp_path / name).read_text().splitlines()]
    routed = [line for line in lines if line["path"] == "/v1/chat/completions"]
    rows = 0
    for name in ("ledger.db", "ledger-2.db"):
        with sqlite3.connect(tmp_path / name) as db:
            rows += db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0]
    assert done > 20
    assert (len(routed), rows) == (done, done)
    assert (tmp_path / "access-2.log").read_text()  # the reload did move them
    with sqlite3.connect(tmp_path / "ledger-2.db") as db:
        assert db.execute("SELECT COUNT(*) FROM decisions").fetchone()[0] > 0


async def test_a_sighup_during_a_reload_runs_after_it(service: Running, tmp_path: Path) -> None:
    moved = base_config(*service.ports, tmp_path)
    moved["ledger"]["path"] = str(tmp_path / "ledger-2.db")  # a reload that opens a ledger takes a moment
    service.config.write_text(yaml.safe_dump(moved))
    service.proc.send_signal(signal.SIGHUP)
    await asyncio.sleep(0.005)  # two signals at once would merge in the kernel; this one comes mid-reload
    service.proc.send_signal(signal.SIGHUP)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    stderr = tmp_path / "stderr.log"
    while stderr.read_text().count("reloaded ") < 2:
        assert loop.time() < deadline, f"the second SIGHUP was dropped:\n{stderr.read_text()[-2000:]}"
        await asyncio.sleep(0.05)


async def test_api_key_file_is_read_again_on_sighup(service: Running, tmp_path: Path, upstreams: Any) -> None:
    """A provider's key in a file (systemd's $CREDENTIALS_DIRECTORY): rotated in the file, the
    next SIGHUP puts the new key on the next upstream call, with no restart."""
    up = await upstreams({"/v1/chat/completions": ok_handler("keyed")})
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "upstream").write_text("sk-first\n")
    config = base_config(*service.ports, tmp_path)
    config["providers"]["keyed"] = {"kind": "openai", "base_url": up.url + "/v1",
                                    "api_key_file": str(creds / "upstream")}
    config["routes"]["keyed"] = {"targets": [{"provider": "keyed", "model": "m"}]}

    async def reload() -> None:
        service.messages.clear()
        service.proc.send_signal(signal.SIGHUP)
        await service.wait_for("RELOADING=1")
        await service.wait_for("READY=1")

    service.config.write_text(yaml.safe_dump(config))
    await reload()
    async with aiohttp.ClientSession() as session:
        assert (await chat(session, service, "keyed"))[0] == 200
        (creds / "upstream").write_text("sk-second\n")
        assert (await chat(session, service, "keyed"))[0] == 200  # not read again until told
        await reload()
        assert (await chat(session, service, "keyed"))[0] == 200
    assert [c["headers"]["Authorization"] for c in up.calls] == ["Bearer sk-first", "Bearer sk-first",
                                                                 "Bearer sk-second"]


async def test_sigterm_drains_a_slow_stream_then_exits_zero(service: Running, tmp_path: Path) -> None:
    body = {"model": "slow", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(service.url + "/v1/chat/completions", json=body, headers=service.headers()) as resp:
            first = await resp.content.readany()
            assert first.startswith(b"data: ")
            service.proc.send_signal(signal.SIGTERM)
            await service.wait_for("STOPPING=1")
            async with s.get(service.ops_url + "/readyz") as ready:
                assert ready.status == 503  # the ops listener says so while the main one drains
            with pytest.raises(aiohttp.ClientConnectionError):
                async with s.get(service.url + "/healthz"):
                    pass  # the main listener no longer accepts
            rest = await resp.read()
        assert rest.endswith(b"data: [DONE]\n\n")
        assert (first + rest).count(b'"content"') == 10
    assert await asyncio.wait_for(service.proc.wait(), 15) == 0
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as s, s.get(service.url + "/healthz"):
            pass


async def test_access_log_ledger_and_metrics_after_known_traffic(service: Running, tmp_path: Path) -> None:
    decisions = []
    async with aiohttp.ClientSession() as session:
        for stream in (False, True, False):
            status, header = await chat(session, service, stream=stream)
            assert status == 200
            decisions.append(header)
        async with session.get(service.url + "/metrics", headers=service.headers()) as resp:
            text = await resp.text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("firstbyte_requests_total", (("route", "chat"), ("served", "fast"), ("status", "200")))] == 3
    assert samples[("firstbyte_attempts_total", (("outcome", "200"), ("target", "fast")))] == 3
    assert samples[("firstbyte_decisions_total", (("first_reason", "written"), ("route", "chat")))] == 3
    assert samples[("firstbyte_breaker_state", (("target", "fast"),))] == 0
    for mode in ("buffered", "streamed"):  # one figure per mode: both kinds of call were made
        assert ("firstbyte_target_latency_seconds", (("mode", mode), ("target", "fast"))) in samples

    service.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(service.proc.wait(), 15) == 0
    lines = [json.loads(line) for line in (tmp_path / "access.log").read_text().splitlines()]
    routed = [line for line in lines if line["path"] == "/v1/chat/completions"]
    assert [line["decision"] for line in routed] == decisions
    assert all(line["status"] == 200 and line["served"] == "fast" for line in routed)
    log_text = (tmp_path / "access.log").read_text()
    assert KEY not in log_text and "hi" not in log_text.replace("chat", "")

    ids = [parse_header(d).id for d in decisions]
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        rows = db.execute("SELECT id, route, served, status, stream FROM decisions ORDER BY ts").fetchall()
    assert [r[0] for r in rows] == ids
    assert {(r[1], r[2], r[3]) for r in rows} == {("chat", "fast", 200)}
    assert [r[4] for r in rows] == [0, 1, 0]

    summary = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "decisions", "--ledger", str(tmp_path / "ledger.db"), "--since", "1h"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "chat" in summary and "fast" in summary and "100" in summary
    assert "event loop uvloop" in (tmp_path / "stderr.log").read_text()


async def test_a_stream_longer_than_the_grace_is_ended_at_the_grace_with_a_word(tmp_path: Path,
                                                                                unused_tcp_port_factory: Any) -> None:
    """The grace is the grace (aiohttp's own shutdown gave it twice, then cut the stream mid-chunk
    with no word, and the log blamed the client): the stream ends with an error event that says
    why, the log says the drain cut it, and firstbyte exits."""
    port = unused_tcp_port_factory()
    config = tmp_path / "routes.yaml"
    config.write_text(yaml.safe_dump({
        "listen": f"127.0.0.1:{port}", "shutdown_grace": 1,
        "access_log": {"format": "json", "path": str(tmp_path / "access.log")},
        "providers": {"slow": sim(first_ms=5, chunk_ms=500, chunks=40)},  # 20 s of stream
        "routes": {"slow": {"strategy": "ordered", "targets": [{"provider": "slow", "model": "s-1"}]}},
    }))
    with (tmp_path / "stderr.log").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "proxy.cli", "serve", "--config",
                                                    str(config), stderr=stderr)
    try:
        body = {"model": "slow", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                try:
                    async with s.get(f"http://127.0.0.1:{port}/healthz"):
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as resp:
                assert (await resp.content.readany()).startswith(b"data: ")
                proc.send_signal(signal.SIGTERM)
                t0 = asyncio.get_running_loop().time()
                rest = await asyncio.wait_for(resp.read(), 10)  # whole: the chunked body is ended properly
                took = asyncio.get_running_loop().time() - t0
        assert b"firstbyte is shutting down" in rest and not rest.endswith(b"data: [DONE]\n\n")
        assert 0.9 < took < 1.8, took  # at the grace, not at twice it
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    [line] = [json.loads(raw) for raw in (tmp_path / "access.log").read_text().splitlines()]
    assert (line["status"], line["error"]) == (200, "firstbyte is shutting down")
    assert "1 stream(s) ended with an error event" in (tmp_path / "stderr.log").read_text()


async def reload_counts(session: aiohttp.ClientSession, service: Running) -> dict[str, float]:
    """firstbyte_config_reloads_total by result, and the last-reload gauge as ``ok``."""
    async with session.get(service.ops_url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "firstbyte_config_reloads_total":
                out[s.labels["result"]] = s.value
            elif s.name == "firstbyte_config_last_reload_successful":
                out["ok"] = s.value
    return out


async def sighup(service: Running) -> None:
    service.messages.clear()
    service.proc.send_signal(signal.SIGHUP)
    await service.wait_for("RELOADING=1")
    await service.wait_for("READY=1")


async def test_a_reload_that_fails_for_any_reason_is_refused_counted_and_the_old_config_serves(
        service: Running, tmp_path: Path) -> None:
    """Issue 31: a control character (even in a comment) failed the reload silently ("Task exception
    was never retrieved", the gauge stayed 1); a log path that cannot open failed it halfway, the new
    routes serving and the observers not. Each is now one refused line, counted, the old config whole."""
    good = base_config(*service.ports, tmp_path)
    added = {**good, "routes": {**good["routes"], "added": {"targets": [{"provider": "fast", "model": "f-2"}]}}}
    stderr = tmp_path / "stderr.log"
    async with aiohttp.ClientSession() as session:
        service.config.write_text(yaml.safe_dump(added) + "# an editor left a \x01 here\n")
        await sighup(service)
        lines = len(yaml.safe_dump(added).splitlines()) + 1
        assert f"{service.config}:{lines}:20: not valid YAML: control character U+0001" in stderr.read_text()
        assert await reload_counts(session, service) == {"ok": 0, "taken": 0, "refused": 1}

        moved = {**added, "access_log": {"format": "json", "path": str(tmp_path / "no-such-dir" / "access.log")}}
        service.config.write_text(yaml.safe_dump(moved))
        await sighup(service)
        assert "applying it failed: FileNotFoundError" in stderr.read_text()
        assert await reload_counts(session, service) == {"ok": 0, "taken": 0, "refused": 2}
        assert (await chat(session, service, "added"))[0] != 200  # the refused file's route never served
        assert (await chat(session, service))[0] == 200

        service.config.write_text(yaml.safe_dump(added))
        await sighup(service)
        assert await reload_counts(session, service) == {"ok": 1, "taken": 1, "refused": 2}
        assert (await chat(session, service, "added"))[0] == 200
    text = stderr.read_text()
    assert text.count("reload refused, the running config stays") == 2
    assert "Traceback" not in text and "never retrieved" not in text, text
    service.proc.send_signal(signal.SIGTERM)  # the access log writes out as it stops
    assert await asyncio.wait_for(service.proc.wait(), 10) == 0
    log = (tmp_path / "access.log").read_text().splitlines()
    assert [json.loads(line)["route"] for line in log[-3:]] == ["added", "chat", "added"]  # one log throughout


async def test_the_ops_listener_answers_reach_the_access_log(service: Running, tmp_path: Path) -> None:
    """A reviewer's /v1/health, explain, a 404 and a malformed request on ``ops_listen``: none had an access
    log line, so what was asked there could not be found. Its probes and /metrics stay unlogged, as the
    main listener's are (they are polled)."""
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/health", "/v1/routes/chat/explain", "/nope", "/healthz", "/metrics"):
            async with s.get(service.ops_url + path) as resp:
                await resp.read()
    reader, writer = await asyncio.open_connection("127.0.0.1", service.ports[1])
    writer.write(b"POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.split(b" ", 2)[1] == b"400" and b"x-request-id" in answer, answer
    service.proc.send_signal(signal.SIGTERM)  # the access log writes out as it stops
    assert await asyncio.wait_for(service.proc.wait(), 10) == 0
    lines = [json.loads(line) for line in (tmp_path / "access.log").read_text().splitlines()]
    assert [(line["path"], line["status"], line["error"]) for line in lines[:3]] == [
        ("/v1/health", 200, None), ("/v1/routes/chat/explain", 200, None), ("/nope", 404, "http_404")]
    assert [(line["status"], line["error"]) for line in lines[3:]] == [(400, "http_400")]  # aiohttp's path: "/"


async def test_a_restart_only_key_is_warned_against_what_runs_not_the_last_file(service: Running, tmp_path: Path,
                                                                                 unused_tcp_port_factory: Any) -> None:
    """A reviewer's reloads: ``listen`` moved (warned: it takes effect on restart), then moved back to the
    address the process listens on, which was warned again as a change; a third reload of the moved file
    said nothing, though it still was not in effect. The warning compares the file with what runs."""
    async def reload(config: dict[str, Any]) -> None:
        service.config.write_text(yaml.safe_dump(config))
        service.messages.clear()
        service.proc.send_signal(signal.SIGHUP)
        await service.wait_for("RELOADING=1")
        await service.wait_for("READY=1")

    moved = base_config(unused_tcp_port_factory(), service.ports[1], tmp_path)
    for config in (moved, base_config(*service.ports, tmp_path), moved):
        await reload(config)
    log = (tmp_path / "stderr.log").read_text()
    assert log.count("reloaded ") == 3, log
    assert log.count("listen changed: takes effect on restart") == 2, log
