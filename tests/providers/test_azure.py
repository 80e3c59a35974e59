"""``kind: azure`` against a loopback fake that checks Azure OpenAI's wire format, and the
per-provider ``headers:`` map (OpenRouter's HTTP-Referer / X-Title) on every kind that dials."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from proxy.config import parse_config
from proxy.errors import ConfigError

from ..anthropic_fakes import anthropic_provider, messages_handler
from ..conftest import ok_handler, openai_provider, route_config

API_VERSION = "2024-10-21"


def azure_handler(deployment: str, seen: list[dict[str, Any]]) -> Any:
    """Azure OpenAI as documented: the deployment in the path, api-version in the query, the key
    in api-key; anything else is answered as Azure would (404 / 401), so a wrong wire fails."""
    inner = ok_handler("from-azure", chunks=2)

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append({"path": request.path, "query": dict(request.query), "headers": dict(request.headers),
                     "json": await request.json()})
        if request.path != f"/openai/deployments/{deployment}/chat/completions":
            return web.json_response({"error": {"code": "DeploymentNotFound", "message": "no such deployment"}},
                                     status=404)
        if request.query.get("api-version") != API_VERSION:
            return web.json_response({"error": {"code": "404", "message": "Resource not found"}}, status=404)
        if request.headers.get("api-key") != "azure-secret" or "authorization" in request.headers:
            return web.json_response({"error": {"code": "401", "message": "Access denied"}}, status=401)
        return await inner(request)

    return handle


async def azure_proxy(upstreams, proxy, seen, **provider: Any):
    up = await upstreams({"*": azure_handler("gpt4o-prod", seen)})
    config = route_config([{"provider": "az", "model": "gpt4o-prod"}],
                          {"az": {"kind": "azure", "base_url": up.url, "api_key_env": "AZ_KEY",
                                  "api_version": API_VERSION, **provider}})
    return await proxy(config, env={"AZ_KEY": "azure-secret"})


@pytest.mark.parametrize("stream", [pytest.param(False, id="buffered"), pytest.param(True, id="streamed")])
async def test_chat_reaches_the_deployment_with_api_key_and_version(upstreams, proxy, stream):
    seen: list[dict[str, Any]] = []
    p = await azure_proxy(upstreams, proxy, seen)
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="client-key", max_retries=0)
    ask: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        text = "".join([c.choices[0].delta.content or "" async for c in await client.chat.completions.create(
            **ask, stream=True) if c.choices])
        assert text == "from-azure0from-azure1"
    else:
        answer = await client.chat.completions.create(**ask)
        assert answer.choices[0].message.content == "from-azure"
    await client.close()
    assert seen[0]["query"] == {"api-version": API_VERSION}
    assert "model" not in seen[0]["json"]  # the deployment names the model
    assert "client-key" not in str(seen[0]["headers"])


async def test_responses_reach_azure_through_its_chat_api(upstreams, proxy):
    seen: list[dict[str, Any]] = []
    p = await azure_proxy(upstreams, proxy, seen)
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0)
    answer = await client.responses.create(model="chat", input="hi", reasoning={"effort": "low"})
    await client.close()
    assert answer.output_text == "from-azure"
    assert seen[0]["json"]["reasoning_effort"] == "low"


async def test_an_azure_error_comes_back_in_the_openai_shape(upstreams, proxy):
    seen: list[dict[str, Any]] = []
    p = await azure_proxy(upstreams, proxy, seen, api_version="2023-01-01")
    status, _, body = await p.post("/v1/chat/completions", {"model": "chat", "messages": []})
    assert status == 404 and orjson.loads(body)["error"]["message"] == "Resource not found"


async def test_static_headers_reach_openai_and_anthropic_kinds(upstreams, proxy):
    router = await upstreams({"/v1/chat/completions": ok_handler("routed")})
    claude = await upstreams({"/v1/messages": messages_handler("claude")})
    extra = {"HTTP-Referer": "https://example.com/app", "X-Title": "firstbyte test"}
    p = await proxy(route_config(
        [{"provider": "openrouter", "model": "m"}, {"provider": "claude", "model": "c"}],
        {"openrouter": openai_provider(router.url, headers=extra, api_key_env="OR_KEY"),
         "claude": anthropic_provider(claude.url, headers={"X-Team": "core"})}), env={"OR_KEY": "or-secret"})
    await p.post("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
    await p.post("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
                 headers={"x-route-provider": "claude"})
    sent = router.calls[0]["headers"]
    assert sent["HTTP-Referer"] == "https://example.com/app" and sent["X-Title"] == "firstbyte test"
    assert sent["Authorization"] == "Bearer or-secret"
    assert claude.calls[0]["headers"]["X-Team"] == "core"


@pytest.mark.parametrize(
    ("provider", "problem"),
    [
        pytest.param({"kind": "openai", "base_url": "http://x", "headers": {"Authorization": "Bearer k"}},
                     "providers.p.headers.Authorization: may not be set here (a credential: name its environment "
                     "variable in api_key_env instead)", id="credential-refused"),
        pytest.param({"kind": "openai", "base_url": "http://x", "headers": {"Content-Type": "text/plain"}},
                     "providers.p.headers.Content-Type: may not be set here (set by firstbyte itself)",
                     id="own-header-refused"),
        pytest.param({"kind": "openai", "base_url": "http://x", "headers": {"Bad Name": "v"}},
                     "providers.p.headers.Bad Name: not a valid header name", id="bad-name"),
        pytest.param({"kind": "openai", "base_url": "http://x", "headers": {"X-A": "a\r\nX-B: b"}},
                     "providers.p.headers.X-A: value may not contain line breaks or NUL", id="header-injection"),
        pytest.param({"kind": "simulated", "headers": {"X-A": "a"}},
                     "providers.p.headers: only for kinds that call over HTTP (not simulated)", id="simulated"),
        pytest.param({"kind": "anthropic", "base_url": "http://x", "responses": True},
                     "providers.p.responses: only for kind openai", id="responses-only-openai"),
        pytest.param({"kind": "openai", "base_url": "http://x", "api_version": "2024-10-21"},
                     "providers.p.api_version: only for kind azure", id="api-version-only-azure"),
        pytest.param({"kind": "azure"}, "providers.p.base_url: required for kind azure", id="azure-needs-base-url"),
    ],
)
def test_provider_problems_name_their_path(provider: dict[str, Any], problem: str) -> None:
    raw = {"providers": {"p": provider}, "routes": {"chat": {"targets": [{"provider": "p", "model": "m"}]}}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw, {})
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


# A pin's model is the deployment, a segment of the URL path: one that could climb out of
# /openai/deployments/ (issue 31: "az/.." reached /openai/chat/completions) is refused before any call.

@pytest.mark.parametrize("deployment", [
    pytest.param("..", id="dot-dot"),
    pytest.param(".", id="dot"),
    pytest.param("../chat", id="dot-dot-slash"),
    pytest.param("%2e%2e", id="encoded-dot-dot"),
    pytest.param("..%2fx", id="encoded-slash"),
    pytest.param("a/b", id="slash"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("x?y#z", id="query-and-fragment"),
])
async def test_a_pin_whose_deployment_would_leave_the_path_is_refused(upstreams, proxy, deployment):
    seen: list[dict[str, Any]] = []
    p = await azure_proxy(upstreams, proxy, seen)
    status, _, body = await p.post("/v1/chat/completions", {"model": f"az/{deployment}",
                                                             "messages": [{"role": "user", "content": "hi"}]})
    error = orjson.loads(body)["error"]
    assert status == 400, body
    assert (error["param"], error["code"]) == ("model", "invalid_model")
    assert "URL path" in error["message"]
    assert seen == []


async def test_a_pin_to_a_deployment_with_dots_and_dashes_is_served(upstreams, proxy):
    seen: list[dict[str, Any]] = []
    p = await azure_proxy(upstreams, proxy, seen)
    status, _, body = await p.post("/v1/chat/completions", {"model": "az/gpt4o-prod",
                                                             "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    assert [s["path"] for s in seen] == ["/openai/deployments/gpt4o-prod/chat/completions"]


async def test_a_configured_deployment_that_would_leave_the_path_is_never_called(upstreams, proxy):
    seen: list[dict[str, Any]] = []
    up = await upstreams({"*": azure_handler("gpt4o-prod", seen)})
    config = route_config([{"provider": "az", "model": ".."}],
                          {"az": {"kind": "azure", "base_url": up.url, "api_key_env": "AZ_KEY"}})
    p = await proxy(config, env={"AZ_KEY": "azure-secret"})
    status, _, body = await p.post("/v1/chat/completions", {"model": "chat",
                                                             "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400, body
    assert "URL path" in orjson.loads(body)["error"]["message"]
    assert seen == []
