"""Every answer is JSON and logged: paths aiohttp's router cannot reach get the catch-all's answer.

A ``%0a`` in the path escaped the catch-all's ``.*``; ``OPTIONS *``, ``CONNECT host:port`` and an
absolute URL without a path never reach a resource at all. Each got aiohttp's plain-text 404 and
no access-log line.
"""

from __future__ import annotations

import asyncio
import io

import orjson
import pytest

from proxy.config import AccessLog as AccessLogConfig
from proxy.gateway import Gateway
from proxy.observe.accesslog import AccessLog
from proxy.server.ops import build_ops_app

from ..conftest import make_config, serve_on_loopback

CONFIG = {"providers": {"s": {"kind": "simulated"}}, "routes": {"chat": {"targets": [{"provider": "s", "model": "m"}]}}}


async def raw(port: int, target: bytes) -> tuple[int, bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(target + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    try:
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head.lower(), body


TARGETS = [
    pytest.param(b"GET /%0a", 404, "/\n", id="newline-at-root"),
    pytest.param(b"POST /v1/chat%0acompletions", 404, "/v1/chat\ncompletions", id="newline-in-an-endpoint"),
    pytest.param(b"GET /v1/%0d%0a", 404, "/v1/\r\n", id="crlf-under-v1"),
    pytest.param(b"OPTIONS *", 404, "*", id="asterisk-form"),
    pytest.param(b"CONNECT example.com:443", 404, "", id="authority-form"),
    pytest.param(b"GET http://example.com", 404, "", id="absolute-form-without-path"),
    pytest.param(b"DELETE /v1/chat/completions", 405, "/v1/chat/completions", id="method-not-allowed"),
]


@pytest.mark.parametrize(("target", "status", "path"), TARGETS)
async def test_a_path_the_router_cannot_reach_gets_json_and_a_log_line(proxy, target, status, path):
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    p = await proxy(CONFIG, observers=[access])
    got, head, body = await raw(p.port, target)
    await asyncio.sleep(0)  # the observers run on the loop's next turn
    await access.close()
    assert got == status
    assert b"content-type: application/json" in head
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == f"http_{status}"
    logged = [orjson.loads(line) for line in lines.getvalue().splitlines()]
    assert [(entry["status"], entry["path"]) for entry in logged] == [(status, path)]


@pytest.mark.parametrize("target", [b"GET /%0a", b"OPTIONS *", b"GET http://example.com"])
async def test_the_ops_listener_answers_every_path_in_json_too(target):
    runner, url = await serve_on_loopback(build_ops_app(Gateway(make_config(CONFIG)), None), 1)
    try:
        got, head, body = await raw(int(url.rsplit(":", 1)[1]), target)
    finally:
        await runner.cleanup()
    assert got == 404 and b"content-type: application/json" in head
    assert orjson.loads(body)["error"]["code"] == "http_404"


@pytest.mark.parametrize(("target", "status"), [
    pytest.param(b"GET /v1/health", 200, id="health"),
    pytest.param(b"GET /v1/nothing-here", 404, id="not-an-ops-endpoint"),
])
async def test_the_ops_listeners_logged_answers_carry_the_id_their_log_line_has(target, status):
    """The ops listener's health and 404 lines read ``id=-`` (their answers had no x-request-id), so a
    line could not be matched to the answer a person was looking at; explain's had one."""
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    runner, url = await serve_on_loopback(build_ops_app(Gateway(make_config(CONFIG), observers=[access]), None), 1)
    try:
        got, head, _ = await raw(int(url.rsplit(":", 1)[1]), target)
        await asyncio.sleep(0)  # the observers run on the loop's next turn
    finally:
        await runner.cleanup()
        await access.close()
    assert got == status
    (entry,) = [orjson.loads(line) for line in lines.getvalue().splitlines()]
    rid = entry["id"]
    assert rid not in (None, "-") and f"x-request-id: {rid}".encode() in head, (entry, head)
