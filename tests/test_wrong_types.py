"""OpenAI stream chunks whose fields have the wrong types (a reviewer's ``{"choices":"oops"}`` before valid
content, ``{"delta":{"content":5}}``), before the first token: docs/DESIGN.md's failure rules say fail over
while nothing has reached the client. Passthrough (the openai SDK on /v1/chat/completions) and translated
(the anthropic SDK on /v1/messages) both get the next target's answer, and the decision names why.
After the first token the stream ends with an error event instead (tests/test_relay.py's table)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from .anthropic_fakes import anthropic_provider, event, messages_handler, text_events
from .conftest import chunk_event, decision_of, openai_provider, route_config, streaming

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
ASK = {"model": "chat", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
CHOICES = b'data: {"id":"c","object":"chat.completion.chunk","choices":"oops"}\n\n'
CONTENT = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":5}}]}\n\n'
ROLE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'


GOOD = (ROLE, chunk_event("from-good"), chunk_event("", "stop"), b"data: [DONE]\n\n")


async def two_targets(upstreams, proxy, opening: bytes):
    bad = await upstreams({"/v1/chat/completions": streaming(
        ROLE, opening, chunk_event("from-bad"), chunk_event("", "stop"), b"data: [DONE]\n\n")})
    good = await upstreams({"/v1/chat/completions": streaming(*GOOD)})
    return await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                    {"bad": openai_provider(bad.url), "good": openai_provider(good.url)}))


WRONG = [pytest.param(CHOICES, id="choices-a-string-then-valid-content"),
         pytest.param(CONTENT, id="content-a-number")]


async def openai_reads(url: str) -> tuple[str, dict[str, str]]:
    """The text the openai SDK streams from ``url``, and the answer's headers."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(**CHAT, stream=True)
        words = [chunk.choices[0].delta.content async for chunk in raw.parse() if chunk.choices]
    finally:
        await client.close()
    return "".join(w or "" for w in words), dict(raw.headers)


async def anthropic_reads(url: str) -> tuple[str, dict[str, str]]:
    """The text the anthropic SDK streams from ``url`` (translated from chat), and the headers."""
    client = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
    try:
        raw = await client.messages.with_raw_response.create(**ASK, stream=True)
        texts = [event.delta.text async for event in await raw.parse()
                 if event.type == "content_block_delta" and event.delta.type == "text_delta"]
    finally:
        await client.close()
    return "".join(texts), dict(raw.headers)


def failed_over(headers: dict[str, str]) -> None:
    decision = decision_of(headers)
    (name, detail), served = decision.attempts[0], decision.served
    assert (name, served) == ("bad", "good") and detail.startswith("malformed stream "), decision


@pytest.mark.parametrize("opening", WRONG)
@pytest.mark.parametrize("reads", [openai_reads, anthropic_reads], ids=["openai-sdk", "anthropic-sdk"])
async def test_a_wrongly_typed_chunk_before_the_first_token_fails_over(upstreams, proxy, opening: bytes, reads):
    p = await two_targets(upstreams, proxy, opening)
    text, headers = await reads(p.url)
    assert text == "from-good"
    failed_over(headers)


async def test_an_anthropic_text_that_is_not_a_string_before_the_first_token_fails_over(upstreams, proxy):
    """Translated to chat, ``"text": 5`` would reach the openai SDK as ``"content": 5``."""
    events = text_events(["from-bad"])
    wrong = event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": 5}})
    bad = await upstreams({"/v1/messages": messages_handler(events=[*events[:2], wrong, *events[2:]])})
    good = await upstreams({"/v1/messages": messages_handler(words=["from-good"])})
    p = await proxy(route_config([{"provider": "bad", "model": "c"}, {"provider": "good", "model": "c"}],
                                 {"bad": anthropic_provider(bad.url), "good": anthropic_provider(good.url)}))
    text, headers = await openai_reads(p.url)
    assert text == "from-good"
    failed_over(headers)


# A first event a client's parser reads otherwise than its bytes suggest. The gate's lean first-read path
# judged each by its bytes (a ``"content":"..."`` and no suspect field) and committed it unparsed:
# - a key spelt with a JSON escape (``c\u006fntent`` is ``content``), the last of two the one a parser keeps:
#   content is an object;
# - content behind 5,000 nested objects, or followed by 5,000 nested arrays (a reviewer's): the openai SDK's
#   parser raised RecursionError in the application (the lean path's reach bounded only what came before).
ESCAPED = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
           b'"delta":{"content":"x","c\\u006fntent":{"a":1}}}]}\n\n')
DEEP = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"x":'
        + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b',"content":"hi"}}]}\n\n')
DEEP_AFTER = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},'
              b'"x":' + b"[" * 5000 + b"]" * 5000 + b"}]}\n\n")
# 700 levels: orjson reads it (1,024), so the gate's parse passed it; Python's json in the client is near its
# recursion limit there (it raised near 1,000, less the application's own stack). Past MAX_CHUNK_DEPTH (512).
DEEP_READ = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"},'
             b'"x":' + b"[" * 700 + b"]" * 700 + b"}]}\n\n")


@pytest.mark.parametrize("first", [pytest.param(ESCAPED, id="a-key-spelt-with-an-escape"),
                                   pytest.param(DEEP, id="nested-past-a-parser-before-the-content"),
                                   pytest.param(DEEP_AFTER, id="nested-past-a-parser-behind-the-content"),
                                   pytest.param(DEEP_READ, id="nested-past-the-chunk-depth-orjson-reads")])
async def test_a_first_event_is_judged_as_the_client_reads_it(upstreams, proxy, first: bytes):
    bad = await upstreams({"/v1/chat/completions": streaming(first, b"data: [DONE]\n\n")})
    good = await upstreams({"/v1/chat/completions": streaming(*GOOD)})
    p = await proxy(route_config([{"provider": "bad", "model": "m"}, {"provider": "good", "model": "m"}],
                                 {"bad": openai_provider(bad.url), "good": openai_provider(good.url)}))
    text, headers = await openai_reads(p.url)
    assert text == "from-good"
    failed_over(headers)
