"""The status page: its data over a running gateway, where it is served, and the page itself in a
real headless Chromium (Debian's ``chromium``, driven over the DevTools protocol with aiohttp's
websocket client), which must show a breaker a fault opened without being reloaded.

Without ``chromium`` the browser test fails (scripts/test installs it as root: ``apt-get install
chromium``) unless FIRSTBYTE_NO_BROWSER=1 says the box cannot have it. With
FIRSTBYTE_SCREENSHOT=PATH it also saves its screenshot there (the README's is docs/img/status.png).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.gateway import Gateway
from proxy.observe.hub import Hub
from proxy.server.app import build_app
from proxy.server.ops import build_ops_app
from tests.conftest import FakeUpstream, make_config, ok_handler, openai_provider, serve_on_loopback, status_handler

pytestmark = pytest.mark.timeout(60)


def two_routes(good: str, bad: str) -> dict[str, Any]:
    return {
        "providers": {"fast": openai_provider(good), "flaky": openai_provider(bad),
                      "sim": {"kind": "simulated", "simulate": {"first_chunk_ms": 5, "chunk_ms": 1, "chunks": 2}}},
        "routes": {
            "chat": {"strategy": "ordered", "cooldown": {"failures": 2, "secs": 60},
                     "targets": [{"provider": "flaky", "model": "f-1"}, {"provider": "fast", "model": "g-1"}]},
            "cheap": {"strategy": "fastest", "targets": [{"provider": "sim", "model": "sim-1"}]},
        },
    }


class Running:
    def __init__(self, hub: Hub, runners: list[web.AppRunner], url: str, ops_url: str) -> None:
        self.hub, self.runners, self.url, self.ops_url = hub, runners, url, ops_url

    async def chat(self, route: str = "chat", n: int = 1) -> list[int]:
        out = []
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                async with s.post(self.url + "/v1/chat/completions",
                                  headers={"authorization": "Bearer k1"},
                                  json={"model": route, "messages": [{"role": "user", "content": "hi"}]}) as r:
                    await r.read()
                    out.append(r.status)
        return out


async def start(raw: dict[str, Any], env: dict[str, str] | None = None) -> Running:
    config = make_config(raw, env)
    hub = Hub(config)
    gw = Gateway(config, observers=hub.observers)
    main, url = await serve_on_loopback(build_app(gw, hub), shutdown_timeout=1)
    ops, ops_url = await serve_on_loopback(build_ops_app(gw, hub), shutdown_timeout=1)
    return Running(hub, [main, ops], url, ops_url)


@pytest.fixture
async def running(upstreams: Any) -> AsyncIterator[Running]:
    good: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    bad: FakeUpstream = await upstreams({"*": status_handler(503, "overloaded")})
    r = await start(two_routes(good.url, bad.url))
    yield r
    for runner in r.runners:
        await runner.cleanup()
    await r.hub.close()


async def get(url: str) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return resp.status, resp.headers.get("content-type", ""), await resp.read()


async def test_status_data_reads_the_health_snapshot_and_the_last_hour(running: Running) -> None:
    assert await running.chat(n=3) == [200, 200, 200]  # flaky fails twice: its breaker opens
    await asyncio.sleep(0)  # the observers run on the next turn of the loop
    status, _, body = await get(running.url + "/status/data")
    assert status == 200
    data = orjson.loads(body)
    _, _, health = await get(running.url + "/v1/health")

    def steady(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # without what the clock moves
        return [{k: {m: f for m, f in v.items() if m != "age_s"} if isinstance(v, dict) else v
                 for k, v in row.items() if k != "seconds_left"} for row in rows]

    assert steady(data["targets"]) == steady(orjson.loads(health)["targets"])  # one snapshot, two readers
    flaky = next(t for t in data["targets"] if t["target"] == "flaky")
    assert flaky["breaker"] == "open"
    chat = next(r for r in data["routes"] if r["name"] == "chat")
    assert [o["target"] for o in chat["order"]] == ["fast"]
    assert chat["excluded"][0]["target"] == "flaky" and chat["excluded"][0]["reason"].startswith("breaker open")
    history = data["history"]
    assert history["routes"]["chat"]["requests"] == 3
    assert history["routes"]["chat"]["leader"]["target"] in ("flaky", "fast")
    (minute,) = history["targets"]["flaky"]
    assert minute["failures"] == 2 and minute["answered"] == 0
    (fast,) = history["targets"]["fast"]
    assert fast["answered"] == 3 and fast["ttft_s"] > 0
    decisions = history["decisions"]
    assert len(decisions) == 3 and all(not d["failed"] for d in decisions)
    assert decisions[0]["at"] >= decisions[-1]["at"]  # newest first
    assert "attempts=fast(200" in decisions[0]["decision"]
    assert data["fleet"] == {"link": "alone"}


async def test_the_page_ships_its_script_and_needs_no_network(running: Running) -> None:
    status, content_type, page = await get(running.ops_url + "/status")
    assert status == 200 and content_type.startswith("text/html")
    assert b'id="fleet-link"' in page
    status, content_type, script = await get(running.ops_url + "/status/status.js")
    assert status == 200 and content_type.startswith("text/javascript")
    for body in (page, script):
        assert b"http://" not in body.replace(b"http://www.w3.org/2000/svg", b"") and b"https://" not in body
    assert len(page) + len(script) < 20_000


async def test_behind_client_keys_the_page_is_only_on_the_ops_listener(upstreams: Any) -> None:
    good: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    raw = two_routes(good.url, good.url)
    raw["clients"] = {"keys_env": "KEYS"}
    r = await start(raw, {"KEYS": "k1"})
    try:
        for path in ("/status", "/status/data"):
            status, _, body = await get(r.url + path)
            assert status == 404
            assert b"ops listener" in body and b"client keys" in body
            assert (await get(r.ops_url + path))[0] == 200
    finally:
        for runner in r.runners:
            await runner.cleanup()
        await r.hub.close()


# -- the page in a real browser ----------------------------------------------------------------


class Browser:
    """Headless Chromium with one page, spoken to over the DevTools protocol."""

    def __init__(self, proc: asyncio.subprocess.Process, session: aiohttp.ClientSession,
                 ws: aiohttp.ClientWebSocketResponse) -> None:
        self.proc, self.session, self.ws = proc, session, ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        await self.ws.send_json({"id": mine, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json(timeout=15)
            if message.get("id") == mine:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    async def js(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def until(self, expression: str, timeout: float = 10.0) -> Any:
        """Poll the page until ``expression`` is truthy (the page redraws on its own)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.js(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        shows = await self.js("document.body.innerText")
        raise AssertionError(f"the page never showed {expression}; it shows: {shows}")


@contextlib.asynccontextmanager
async def chromium(url: str, profile: Path) -> AsyncIterator[Browser]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("FIRSTBYTE_NO_BROWSER") == "1":
            pytest.skip("chromium not available and FIRSTBYTE_NO_BROWSER=1")
        pytest.fail("chromium not found: scripts/test installs it when run as root (apt-get install chromium), "
                    "or set FIRSTBYTE_NO_BROWSER=1 where the platform cannot have it")
    proc = await asyncio.create_subprocess_exec(
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--disable-extensions", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
        f"--user-data-dir={profile}", "--window-size=1400,1000", url,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 20
        while not (active.exists() and len(active.read_text().split()) >= 2):
            assert proc.returncode is None, "chromium exited before it listened"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port in 20 s"
            await asyncio.sleep(0.05)
        port = active.read_text().split()[0]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                pages = [t for t in await resp.json() if t["type"] == "page"]
            async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield Browser(proc, session, ws)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_the_page_in_a_browser_shows_routes_targets_and_a_breaker_opening_live(
        running: Running, tmp_path: Path) -> None:
    assert await running.chat("cheap", n=2) == [200, 200]
    async with chromium(running.ops_url + "/status?every=0.25", tmp_path / "profile") as browser:
        # the routes and targets of the running gateway, drawn by the page's own script
        await browser.until("document.querySelectorAll('#routes tbody tr').length === 2")
        routes = await browser.js("[...document.querySelectorAll('#routes tbody tr')].map(r => r.dataset.route)")
        assert routes == ["chat", "cheap"]
        cells = "document.querySelector('#targets tr[data-target=\"flaky\"] td.breaker').textContent"
        assert await browser.js(cells) == "closed"
        assert await browser.js("document.getElementById('fleet-state').textContent") == "alone"
        polls = await browser.js("Number(document.body.dataset.polls)")

        # a fault opens flaky's breaker: the page, not reloaded, shows it within a few polls
        assert await running.chat(n=3) == [200, 200, 200]
        await browser.until(f"{cells}.startsWith('open')")
        assert await browser.js("Number(document.body.dataset.polls)") > polls  # redrawn, not reloaded
        await browser.until("document.querySelectorAll('#decisions li.ok').length === 5")
        assert await browser.js("document.querySelector('#targets tr[data-target=\"flaky\"] svg rect.fail') !== null")
        assert await browser.js("document.querySelector('#targets tr[data-target=\"fast\"] svg circle.dot') !== null")
        excluded = await browser.js("document.querySelector('#routes tr[data-route=\"chat\"]').textContent")
        assert "flaky (breaker open" in excluded

        shot = await browser.call("Page.captureScreenshot", format="png")
    png = base64.b64decode(shot["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "status.png").write_bytes(png)
    if os.environ.get("FIRSTBYTE_SCREENSHOT"):
        Path(os.environ["FIRSTBYTE_SCREENSHOT"]).write_bytes(png)


async def test_the_fleet_link_shows_the_fleet_it_is_in(upstreams: Any, redis_server: Any) -> None:
    from tests.redis_server import PASSWORD

    good: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    raw = two_routes(good.url, good.url)
    raw["state"] = {"redis": redis_server.url, "fleet": "status-page", "password_env": "FLEET_PASSWORD"}
    r = await start(raw, {"FLEET_PASSWORD": PASSWORD})
    try:
        deadline = time.monotonic() + 10
        while True:
            fleet = orjson.loads((await get(r.ops_url + "/status/data"))[2])["fleet"]
            if fleet["link"] == "in-fleet" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert fleet["link"] == "in-fleet" and fleet["fleet"] == "status-page" and fleet["state"] == "in-fleet"
    finally:
        for runner in r.runners:
            await runner.cleanup()
        await r.hub.close()
