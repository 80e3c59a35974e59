"""Client keys and the probes: with keys set, the main listener's ``/metrics`` asks for one and
``/readyz`` tells a caller without one only its status; ``/healthz`` stays open, and the ops
listener serves all three without keys. (``/metrics`` named every route and target, their costs,
and ``/readyz`` the config's path, to anyone who could reach the main listener.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.gateway import Gateway
from proxy.observe.hub import Hub
from proxy.server.app import build_app
from proxy.server.ops import build_ops_app

from ..conftest import make_config, serve_on_loopback

KEY = "client-key-0123456789"
RAW = {"clients": {"keys_env": "KEYS"}, "providers": {"secret-provider": {"kind": "simulated"}},
       "routes": {"secret-route": {"targets": [{"provider": "secret-provider", "model": "m"}]}}}


class Listeners:
    def __init__(self, url: str, ops_url: str) -> None:
        self.url, self.ops_url = url, ops_url


async def gateway(raw: dict[str, Any], env: dict[str, str]) -> AsyncIterator[Listeners]:
    config = make_config(raw, env)
    hub = Hub(config)
    gw = Gateway(config, observers=hub.observers)
    main, url = await serve_on_loopback(build_app(gw, hub), shutdown_timeout=1)
    ops, ops_url = await serve_on_loopback(build_ops_app(gw, hub), shutdown_timeout=1)
    try:
        yield Listeners(url, ops_url)
    finally:
        await main.cleanup()
        await ops.cleanup()
        await hub.close()


@pytest.fixture
async def keyed() -> AsyncIterator[Listeners]:
    async for listeners in gateway(RAW, {"KEYS": KEY}):
        yield listeners


@pytest.fixture
async def open_gateway() -> AsyncIterator[Listeners]:
    async for listeners in gateway({k: v for k, v in RAW.items() if k != "clients"}, {}):
        yield listeners


async def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_metrics_on_the_main_listener_need_a_client_key(keyed: Listeners) -> None:
    status, body = await get(keyed.url + "/metrics")
    assert status == 401 and b"secret-route" not in body
    assert orjson.loads(body)["error"]["code"] == "invalid_api_key"
    assert (await get(keyed.url + "/metrics", "wrong-key-000000"))[0] == 401
    status, body = await get(keyed.url + "/metrics", KEY)
    assert status == 200 and b"firstbyte_" in body


async def test_readyz_tells_a_caller_without_a_key_only_its_status(keyed: Listeners) -> None:
    status, body = await get(keyed.url + "/readyz")
    assert status == 200 and orjson.loads(body) == {"status": "ready"}  # a load balancer's answer
    status, body = await get(keyed.url + "/readyz", KEY)
    assert status == 200 and orjson.loads(body)["routes"] == 1 and "config" in orjson.loads(body)


async def test_healthz_and_the_ops_listener_stay_open(keyed: Listeners) -> None:
    assert await get(keyed.url + "/healthz") == (200, b'{"status":"alive"}')
    for path in ("/healthz", "/readyz", "/metrics"):
        status, body = await get(keyed.ops_url + path)
        assert status == 200, path
    assert b"secret-route" in (await get(keyed.ops_url + "/metrics"))[1]
    assert "config" in orjson.loads((await get(keyed.ops_url + "/readyz"))[1])


async def test_without_client_keys_every_probe_is_open(open_gateway: Listeners) -> None:
    assert (await get(open_gateway.url + "/metrics"))[0] == 200
    assert "config" in orjson.loads((await get(open_gateway.url + "/readyz"))[1])


async def test_explain_answers_carry_a_request_id_on_both_listeners(keyed: Listeners) -> None:
    """Every answer carries ``x-request-id`` (the decision's id for a planned one); explain had none,
    and its plan's decision was called ``explain``."""
    async with aiohttp.ClientSession() as s:
        async with s.get(keyed.ops_url + "/v1/routes/secret-route/explain") as resp:
            rid, body = resp.headers.get("x-request-id"), await resp.json()
        assert resp.status == 200 and rid and body["decision"].startswith(f"id={rid};"), (rid, body)
        async with s.get(keyed.ops_url + "/v1/routes/secret-route/explain",
                         headers={"x-request-id": "mine-1"}) as resp:
            assert resp.headers.get("x-request-id") == "mine-1"
        for url, headers in ((keyed.ops_url + "/v1/routes/nope/explain", {}),
                             (keyed.ops_url + "/v1/routes/secret-route/explain?mode=x", {}),
                             (keyed.url + "/v1/routes/secret-route/explain", {"authorization": f"Bearer {KEY}"})):
            async with s.get(url, headers=headers) as resp:
                assert resp.headers.get("x-request-id"), (url, resp.status)


async def test_cli_explain_from_a_config_asks_the_ops_listener(keyed: Listeners, tmp_path, capsys) -> None:
    """``firstbyte explain ROUTE --config FILE`` from an operator's shell: with client keys the main
    listener answers 401 without ``--key``; the ops listener explains without one, so a file that
    has ``ops_listen`` is asked there."""
    import asyncio

    from proxy.cli import main

    main_port, ops_port = keyed.url.rsplit(":", 1)[1], keyed.ops_url.rsplit(":", 1)[1]
    config = tmp_path / "routes.yaml"
    config.write_text(f"listen: 127.0.0.1:{main_port}\nops_listen: 127.0.0.1:{ops_port}\n"
                      "clients: {keys_env: KEYS}\nproviders: {secret-provider: {kind: simulated}}\n"
                      "routes: {secret-route: {targets: [{provider: secret-provider, model: m}]}}\n")
    code = await asyncio.to_thread(main, ["explain", "secret-route", "--config", str(config)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "route secret-route" in out
