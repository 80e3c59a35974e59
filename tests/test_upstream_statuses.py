"""Statuses a client must not act on (issue 31): an upstream's 101, 3xx, 304 or a number HTTP does not
define never reaches the client. Each becomes a failover-safe ``bad upstream status``: the next target
answers, or the client gets a 502 ``bad_upstream_status`` in the OpenAI shape saying what the upstream
did. The upstreams are raw sockets writing the status line by hand; the clients are real SDKs.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import orjson
import pytest

from .anthropic_fakes import anthropic_provider, messages_handler
from .conftest import decision_of, ok_handler, openai_provider, route_config

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def answering(line: bytes, *headers: bytes) -> Any:
    """A raw upstream script: the status line and headers as given, an empty body, then wait."""

    async def script(reader: Any, writer: Any) -> None:
        writer.write(b"HTTP/1.1 " + line + b"\r\n" + b"".join(h + b"\r\n" for h in headers)
                     + b"Content-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()

    return script


STATUSES = [
    pytest.param(b"101 Switching Protocols", (b"Upgrade: websocket", b"Connection: upgrade"), id="101"),
    pytest.param(b"301 Moved Permanently", (b"Location: http://127.0.0.1:9/v1/chat/completions",), id="301"),
    pytest.param(b"307 Temporary Redirect", (b"Location: http://127.0.0.1:9/v1/chat/completions",), id="307"),
    pytest.param(b"308 Permanent Redirect", (b"Location: /elsewhere",), id="308"),
    pytest.param(b"304 Not Modified", (), id="304"),
    pytest.param(b"600 Beyond", (), id="600"),
    pytest.param(b"099 Below", (), id="099"),
]


@pytest.mark.parametrize(("line", "headers"), STATUSES)
async def test_a_status_no_client_may_act_on_is_a_502_bad_upstream_status(raw_upstreams, proxy, line, headers):
    up = await raw_upstreams(answering(line, *headers))
    p = await proxy(route_config([{"provider": "odd", "model": "m"}], {"odd": openai_provider(up.url)}))
    status, got, body = await p.post("/v1/chat/completions", CHAT)
    assert status == 502, body
    assert "location" not in {k.lower() for k in got}
    error = orjson.loads(body)["error"]
    assert error["code"] == "bad_upstream_status"
    assert error["type"] == "upstream_error" and error["param"] is None
    assert f"upstream answered {line[:3].decode()}" in error["message"] or "switched protocols" in error["message"]
    assert "127.0.0.1:9" not in error["message"]  # what it did, not where it pointed
    assert decision_of(got).attempts[0][1].startswith("bad upstream status")


@pytest.mark.parametrize(("line", "headers"), STATUSES)
async def test_a_status_no_client_may_act_on_fails_over_to_the_next_target(raw_upstreams, upstreams, proxy,
                                                                          line, headers):
    odd = await raw_upstreams(answering(line, *headers))
    good = await upstreams({"*": ok_handler("from-good")})
    p = await proxy(route_config([{"provider": "odd", "model": "m"}, {"provider": "good", "model": "m"}],
                                 {"odd": openai_provider(odd.url), "good": openai_provider(good.url)}))
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        answer = await client.chat.completions.with_raw_response.create(**CHAT)  # type: ignore[call-overload]
    finally:
        await client.close()
    assert answer.parse().choices[0].message.content == "from-good"
    d = decision_of(dict(answer.headers))
    assert d.served == "good"
    assert d.attempts[0][1].startswith("bad upstream status")


async def test_the_anthropic_sdk_never_follows_an_upstreams_redirect_to_a_third_party(raw_upstreams, upstreams,
                                                                                      proxy):
    """The anthropic SDK follows redirects: a relayed 307 made it post the prompt to the address in
    Location. firstbyte answers 502 instead, and the third party hears nothing."""
    third = await upstreams({"*": messages_handler("stolen")})
    up = await raw_upstreams(answering(b"307 Temporary Redirect", b"Location: " + third.url.encode() + b"/v1/messages"))
    p = await proxy(route_config([{"provider": "claude", "model": "claude-x"}], {"claude": anthropic_provider(up.url)}))
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="client-key", max_retries=0)
    try:
        with pytest.raises(anthropic.APIStatusError) as caught:
            await client.messages.create(model="chat", max_tokens=16,
                                         messages=[{"role": "user", "content": "my secret prompt"}])
    finally:
        await client.close()
    assert caught.value.status_code == 502
    assert "307" in str(caught.value)
    assert third.calls == []
