"""Refusals a client can act on, and refusals that are no failovers.

A request a target's API cannot carry is refused with a 400 whose ``param`` names the field and
whose message says what the client can do, never starting with a target's name (that is in
``x-route-decision``). Such a request makes no upstream call, so moving past it is no failover:
it does not count in the access log's ``failovers`` or in ``firstbyte_failovers_total``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.observe.metrics import Metrics

from .anthropic_fakes import anthropic_provider, messages_handler
from .conftest import Recorder, decision_of, ok_handler, openai_provider, route_config

USER = [{"role": "user", "content": "hi"}]
FUNCTION = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


async def mixed(upstreams, proxy, **kwargs):
    """Route ``chat``: an Anthropic target and an OpenAI one; route ``claude``: Anthropic alone;
    route ``gpt``: OpenAI alone."""
    claude = await upstreams({"/v1/messages": messages_handler("from-claude")})
    gpt = await upstreams({"/v1/chat/completions": ok_handler("from-gpt")})
    raw = route_config([{"provider": "claude", "model": "claude-x"}, {"provider": "gpt", "model": "gpt-x"}],
                       {"claude": anthropic_provider(claude.url), "gpt": openai_provider(gpt.url)})
    raw["routes"]["claude"] = {"targets": [{"provider": "claude", "model": "claude-x"},
                                           {"provider": "claude", "model": "claude-y"}]}
    raw["routes"]["gpt"] = {"targets": [{"provider": "gpt", "model": "gpt-x"}]}
    return claude, gpt, await proxy(raw, **kwargs)


REFUSED = [
    pytest.param("/v1/responses", "gpt", {"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id",
                 "send the whole conversation as input", id="responses-previous-response-id"),
    pytest.param("/v1/responses", "gpt", {"input": "hi", "background": True}, "background", "leave it out",
                 id="responses-background"),
    pytest.param("/v1/responses", "gpt", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]",
                 'web_search = "disabled"', id="responses-built-in-tool"),
    pytest.param("/v1/responses", "gpt", {"input": [{"type": "computer_call_output", "call_id": "c"}]},
                 "input[0].type", "send message, function_call and function_call_output items",
                 id="responses-item-type"),
    pytest.param("/v1/responses", "gpt", {"input": "hi", "tool_choice": {"type": "file_search"},
                                          "tools": [{"type": "function", "name": "f"}]}, "tool_choice",
                 "use auto, none, required or a function", id="responses-tool-choice"),
    pytest.param("/v1/chat/completions", "claude", {"messages": USER, "n": 2}, "n", "send n: 1",
                 id="chat-to-anthropic-n"),
    pytest.param("/v1/chat/completions", "claude", {"messages": [{"role": "function", "content": "x"}]},
                 "messages[0].role", "use system, developer, user, assistant or tool", id="chat-to-anthropic-role"),
    pytest.param("/v1/chat/completions", "claude", {"messages": USER, "tools": [{"type": "custom", "name": "g"}]},
                 "tools[0].type", "leave this tool out", id="chat-to-anthropic-tool"),
    pytest.param("/v1/chat/completions", "claude", {"messages": USER, "tools": [FUNCTION],
                                                    "response_format": {"type": "json_object"}},
                 "response_format", "send one of the two", id="chat-to-anthropic-json-with-tools"),
    pytest.param("/v1/responses", "claude", {"input": "hi", "tools": [{"type": "function", "name": "f"}],
                                             "text": {"format": {"type": "json_object"}}},
                 "text.format", "send one of the two", id="responses-to-anthropic-json-with-tools"),
    pytest.param("/v1/responses", "claude", {"input": "hi", "text": {"format": {
        "type": "json_schema", "name": "n", "schema": {"type": "array"}}}},
                 "text.format.schema", "wrap the value in an object property",
                 id="responses-to-anthropic-array-schema"),
    pytest.param("/v1/embeddings", "claude", {"input": "hi"}, "model", "use a route whose targets serve it",
                 id="embeddings-to-anthropic"),
    pytest.param("/v1/messages", "gpt", {"max_tokens": 5, "messages": USER, "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]", "leave it out",
                 id="messages-server-tool"),
]


@pytest.mark.parametrize(("path", "route", "ask", "param", "advice"), REFUSED)
async def test_every_refusal_names_its_field_and_says_what_to_do(upstreams, proxy, path, route, ask, param,
                                                                 advice):
    claude, gpt, p = await mixed(upstreams, proxy)
    status, headers, raw = await p.post(path, {"model": route, **ask})
    assert status == 400, raw
    error = orjson.loads(raw)["error"]
    if path == "/v1/messages":  # the Anthropic shape: no param field, the words say it
        assert error["type"] == "invalid_request_error"
        assert param.split("[")[0] in error["message"] or advice in error["message"]
    else:
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "untranslatable", param)
    assert advice in error["message"]
    for name in ("claude", "gpt", "claude/claude-x", "claude/claude-y"):
        assert not error["message"].startswith(name), error["message"]
    assert decision_of(headers).attempt_outcomes()[-1][1] == "untranslatable"
    assert claude.calls == [] and gpt.calls == []


async def test_previous_response_id_is_a_400_naming_it_with_what_to_send_instead(upstreams, proxy):
    _, _, p = await mixed(upstreams, proxy)
    status, _, raw = await p.post("/v1/responses", {"model": "chat", "input": "hi", "previous_response_id": "r"})
    assert status == 400
    assert orjson.loads(raw)["error"] == {
        "message": "'previous_response_id' needs a response store; send the whole conversation as input instead "
                   "(with store: false), or route to a provider with responses: true",
        "type": "invalid_request_error", "param": "previous_response_id", "code": "untranslatable"}


def failovers_of(metrics: str, route: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                if s.name == "firstbyte_failovers_total" and s.labels.get("route") == route)  # absent: 0


async def test_an_untranslatable_request_is_no_failover(upstreams, proxy):
    """n: 2 cannot go to either Anthropic target of ``claude``: refused with two untranslatable
    attempts and no failover; on ``chat`` it moves past Claude to GPT without calling Claude:
    served, with no failover either."""
    recorder = Recorder()
    metrics = Metrics({"chat", "claude", "gpt"}, {"claude", "gpt", "claude/claude-x", "claude/claude-y"})
    claude, gpt, p = await mixed(upstreams, proxy, observers=[recorder, metrics])
    status, headers, _ = await p.post("/v1/chat/completions", {"model": "claude", "messages": USER, "n": 2})
    assert status == 400
    assert [o for _, o in decision_of(headers).attempt_outcomes()] == ["untranslatable", "untranslatable"]
    status, headers, _ = await p.post("/v1/chat/completions", {"model": "chat", "messages": USER, "n": 2})
    assert status == 200
    assert decision_of(headers).attempt_outcomes() == [("claude", "untranslatable"), ("gpt", "200")]
    assert claude.calls == [] and len(gpt.calls) == 1
    await p.stop()
    body, _ = metrics.render()
    assert failovers_of(body.decode(), "claude") == 0
    assert failovers_of(body.decode(), "chat") == 0
    finished: dict[str, Any] = {f.decision.route: f.decision for f in recorder.seen if f.decision is not None}
    assert finished["claude"].failovers == 0 and finished["chat"].failovers == 0
