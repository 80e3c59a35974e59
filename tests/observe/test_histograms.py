"""The client-side latency series and the healthy-targets gauge, scraped from a running gateway."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from proxy.gateway import Gateway
from proxy.observe.hub import Hub
from proxy.server.app import build_app
from tests.conftest import FakeUpstream, make_config, ok_handler, openai_provider, serve_on_loopback, status_handler


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_client_latency_per_route_and_status_and_healthy_targets_per_route(upstreams: Any) -> None:
    good: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    bad: FakeUpstream = await upstreams({"*": status_handler(503, "overloaded")})
    config = make_config({
        "providers": {"good": openai_provider(good.url), "bad": openai_provider(bad.url)},
        "routes": {"chat": {"targets": [{"provider": "good", "model": "g"}]},
                   "broken": {"cooldown": {"failures": 1, "secs": 60}, "targets": [{"provider": "bad", "model": "b"}]}},
    })
    hub = Hub(config)
    runner, url = await serve_on_loopback(build_app(Gateway(config, observers=hub.observers), hub), 1)
    try:
        async with aiohttp.ClientSession() as s:
            for model, stream in (("chat", False), ("chat", True), ("broken", False), ("nope", False)):
                async with s.post(url + "/v1/chat/completions", json={
                        "model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}) as r:
                    await r.read()
            async with s.get(url + "/v1/models") as r:  # not routed: not a client latency
                await r.read()
            async with s.get(url + "/metrics") as r:
                got = samples(await r.text())
    finally:
        await runner.cleanup()
        await hub.close()

    def count(name: str, **labels: str) -> float:
        return got.get((name, frozenset(labels.items())), 0.0)

    assert count("firstbyte_client_first_byte_seconds_count", route="chat", status="200") == 2
    assert count("firstbyte_client_duration_seconds_count", route="chat", status="200") == 2
    assert count("firstbyte_client_duration_seconds_bucket", route="chat", status="200", le="+Inf") == 2
    assert 0 < count("firstbyte_client_duration_seconds_sum", route="chat", status="200") < 5
    assert count("firstbyte_client_duration_seconds_count", route="broken", status="503") == 1
    assert count("firstbyte_client_duration_seconds_count", route="other", status="404") == 1  # a model typed
    routes = {dict(labels).get("route") for name, labels in got if name.startswith("firstbyte_client_")}
    assert routes == {"chat", "broken", "other"}
    # one failure opened broken's only breaker: no healthy target there, chat's one is
    assert count("firstbyte_route_healthy_targets", route="broken") == 0
    assert count("firstbyte_route_healthy_targets", route="chat") == 1
