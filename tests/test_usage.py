"""Usage and cost end to end: known traffic, then ledger rows, access-log lines and metrics."""

from __future__ import annotations

import io
import sqlite3
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import AccessLog as AccessLogConfig
from proxy.config import Price
from proxy.observe.accesslog import AccessLog
from proxy.observe.ledger import Ledger
from proxy.observe.metrics import Metrics
from proxy.routing.cost import cost_of
from proxy.translate.usage import usage_of_body

from .anthropic_fakes import USAGE_IN, USAGE_OUT, anthropic_provider, messages_handler
from .conftest import chunk_event, decision_of, ok_handler, openai_provider, sse

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
GPT_PRICE = {"input": 2.5, "output": 10.0}
CLAUDE_PRICE = {"input": 3.0, "output": 15.0}
GPT_STREAM_USAGE = (11, 4)


def gpt_stream_handler():
    """A streaming OpenAI fake that sends the usage chunk only when asked for it."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return await ok_handler("buffered")(request)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for piece in (chunk_event("x"), chunk_event("y"), chunk_event("", "stop")):
            await response.write(piece)
        if (body.get("stream_options") or {}).get("include_usage"):
            prompt, completion = GPT_STREAM_USAGE
            await response.write(sse({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                      "choices": [], "usage": {"prompt_tokens": prompt,
                                                               "completion_tokens": completion,
                                                               "total_tokens": prompt + completion}}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


@pytest.fixture
async def metered(upstreams, proxy, tmp_path):
    """Two routes (an OpenAI target, an Anthropic target), all three observers."""
    gpt = await upstreams({"/v1/chat/completions": gpt_stream_handler()})
    claude = await upstreams({"/v1/messages": messages_handler()})
    raw = {
        "providers": {"gpt": openai_provider(gpt.url), "claude": anthropic_provider(claude.url)},
        "routes": {
            "fast": {"strategy": "ordered", "targets": [{"provider": "gpt", "model": "g", "price": GPT_PRICE}]},
            "smart": {"strategy": "ordered",
                      "targets": [{"provider": "claude", "model": "c", "price": CLAUDE_PRICE}]},
        },
    }
    lines = io.StringIO()
    access = AccessLog(AccessLogConfig(format="json"), stream=lines)
    ledger = Ledger(str(tmp_path / "ledger.db"), retention_days=30, queue_size=100)
    await ledger.start()
    metrics = Metrics({"fast", "smart"}, {"gpt", "claude"})
    p = await proxy(raw, observers=[access, metrics, ledger])
    return p, access, ledger, metrics, lines, gpt


def expected_cost(prompt: int, completion: int, price: dict[str, float]) -> float:
    return (prompt * price["input"] + completion * price["output"]) / 1e6


async def test_usage_and_cost_reach_ledger_access_log_and_metrics(metered):
    p, access, ledger, metrics, lines, _ = metered
    traffic = [
        ("/v1/chat/completions", {"model": "fast", **CHAT}, (3, 1), GPT_PRICE),  # ok_handler's usage
        ("/v1/chat/completions", {"model": "fast", **CHAT, "stream": True}, GPT_STREAM_USAGE, GPT_PRICE),
        ("/v1/chat/completions", {"model": "smart", **CHAT}, (USAGE_IN, USAGE_OUT), CLAUDE_PRICE),
        ("/v1/chat/completions", {"model": "smart", **CHAT, "stream": True}, (USAGE_IN, USAGE_OUT), CLAUDE_PRICE),
        ("/v1/messages", {"model": "smart", "max_tokens": 9, **CHAT}, (USAGE_IN, USAGE_OUT), CLAUDE_PRICE),
        ("/v1/messages", {"model": "smart", "max_tokens": 9, **CHAT, "stream": True}, (USAGE_IN, USAGE_OUT),
         CLAUDE_PRICE),
        ("/v1/messages", {"model": "fast", "max_tokens": 9, **CHAT, "stream": True}, GPT_STREAM_USAGE, GPT_PRICE),
    ]
    expected = {}
    for path, body, (prompt, completion), price in traffic:
        status, headers, _ = await p.post(path, body)
        assert status == 200
        expected[decision_of(headers).id] = (prompt, completion, expected_cost(prompt, completion, price))
    await access.close()
    await ledger.close()

    logged = {line["id"]: line for line in map(orjson.loads, lines.getvalue().splitlines())}
    assert {k: (v["prompt_tokens"], v["completion_tokens"], v["cost_usd"]) for k, v in logged.items()} == expected

    conn = sqlite3.connect(ledger.path)
    rows = conn.execute("SELECT id, prompt_tokens, completion_tokens, cost_usd FROM decisions").fetchall()
    conn.close()
    assert {r[0]: r[1:] for r in rows} == expected

    body, _ = metrics.render()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body.decode()) for s in family.samples}

    def metric(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    gpt_calls = [e for e, t in zip(expected.values(), traffic, strict=True) if t[3] is GPT_PRICE]
    claude_calls = [e for e, t in zip(expected.values(), traffic, strict=True) if t[3] is CLAUDE_PRICE]
    assert metric("firstbyte_tokens_total", target="gpt", kind="prompt") == sum(c[0] for c in gpt_calls)
    assert metric("firstbyte_tokens_total", target="gpt", kind="completion") == sum(c[1] for c in gpt_calls)
    assert metric("firstbyte_tokens_total", target="claude", kind="prompt") == sum(c[0] for c in claude_calls)
    assert metric("firstbyte_tokens_total", target="claude", kind="completion") == sum(c[1] for c in claude_calls)
    assert metric("firstbyte_cost_usd_total", route="fast", target="gpt") == pytest.approx(
        sum(c[2] for c in gpt_calls), rel=1e-12)
    assert metric("firstbyte_cost_usd_total", route="smart", target="claude") == pytest.approx(
        sum(c[2] for c in claude_calls), rel=1e-12)


async def test_usage_chunk_is_removed_unless_the_client_asked(metered):
    p, *_, gpt = metered
    _, _, plain = await p.post("/v1/chat/completions", {"model": "fast", **CHAT, "stream": True})
    assert gpt.calls[-1]["json"]["stream_options"] == {"include_usage": True}
    assert b'"usage"' not in plain and plain.endswith(b"data: [DONE]\n\n")
    assert plain.count(b"data: ") == 4  # x, y, the finish chunk, [DONE]

    asked = {"model": "fast", **CHAT, "stream": True, "stream_options": {"include_usage": True}}
    _, _, kept = await p.post("/v1/chat/completions", asked)
    assert b'"usage":{"prompt_tokens":11' in kept


async def test_usage_chunk_split_across_reads_is_still_counted_and_removed(upstreams, proxy):
    usage = sse({"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}})

    async def dribble(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("z", "stop"))
        for i in range(0, len(usage), 7):
            await response.write(usage[i : i + 7])
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    up = await upstreams({"/v1/chat/completions": dribble})
    metrics = Metrics({"chat"}, {"up"})
    p = await proxy({"providers": {"up": openai_provider(up.url)},
                     "routes": {"chat": {"targets": [{"provider": "up", "model": "m"}]}}}, observers=[metrics])
    _, _, body = await p.post("/v1/chat/completions", {"model": "chat", **CHAT, "stream": True})
    assert b"usage" not in body and b'"z"' in body
    rendered = metrics.render()[0].decode()
    assert 'firstbyte_tokens_total{kind="completion",target="up"} 6' in rendered


@pytest.mark.parametrize(
    ("op", "body", "usage"),
    [
        pytest.param("chat", {"usage": {"prompt_tokens": 3, "completion_tokens": 2}},
                     {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}, id="openai-shape"),
        pytest.param("messages", {"usage": {"input_tokens": 3, "cache_read_input_tokens": 4, "output_tokens": 2}},
                     {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}, id="anthropic-cache-counts"),
        pytest.param("embeddings", {"usage": {"prompt_tokens": 8, "total_tokens": 8}},
                     {"prompt_tokens": 8, "completion_tokens": 0, "total_tokens": 8}, id="embeddings"),
        pytest.param("chat", {"choices": []}, None, id="no-usage"),
        pytest.param("chat", {"usage": None}, None, id="null-usage"),
    ],
)
def test_usage_of_body(op, body, usage):
    assert usage_of_body(op, orjson.dumps(body)) == usage


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("x" * 100_000, id="plain-large-answer"),
        pytest.param('quoted {"usage": {"prompt_tokens": 999}} ' * 3000, id="answer-text-that-looks-like-usage"),
    ],
)
def test_usage_of_a_large_body_reads_only_the_real_usage_object(content):
    body = {"choices": [{"message": {"content": content}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 2}}}
    raw = orjson.dumps(body)
    assert len(raw) > 32 * 1024
    assert usage_of_body("chat", raw) == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


@pytest.mark.parametrize(
    ("usage", "price", "cost"),
    [
        pytest.param({"prompt_tokens": 1_000_000, "completion_tokens": 0}, Price(2.5, 10), 2.5, id="input-only"),
        pytest.param({"prompt_tokens": 1000, "completion_tokens": 500}, Price(3, 15), 0.0105, id="both"),
        pytest.param({"prompt_tokens": 10, "completion_tokens": 1}, None, None, id="undeclared-price"),
        pytest.param(None, Price(1, 1), None, id="unknown-usage"),
    ],
)
def test_cost_of(usage, price, cost):
    assert cost_of(usage, price) == (pytest.approx(cost) if cost is not None else None)


def _sse(obj: object, sep: bytes = b"\n\n") -> bytes:
    return b"data: " + orjson.dumps(obj) + sep


@pytest.mark.parametrize("sep", [pytest.param(b"\n\n", id="lf"), pytest.param(b"\r\n\r\n", id="crlf")])
@pytest.mark.parametrize("keep", [pytest.param(False, id="client-did-not-ask"), pytest.param(True, id="client-asked")])
def test_tap_counts_and_drops_only_the_usage_chunk_of_a_whole_stream_in_one_read(sep: bytes, keep: bool) -> None:
    from proxy.translate.usage_taps import OpenAIUsageTap

    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None}
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None}
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    head = _sse(chunk, sep) + _sse(finish, sep)
    tail = b"data: [DONE]" + sep
    tap = OpenAIUsageTap(keep_usage_chunk=keep)
    out = tap.feed(head + _sse(usage, sep) + tail)
    assert out == (head + _sse(usage, sep) + tail if keep else head + tail)
    assert tap.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert tap.done


def litellm_handler(usage_chunk: dict[str, Any]) -> Any:
    """A stream as LiteLLM's proxy (and others) send it: the usage on a chunk of its own, whose
    ``choices`` is not empty but holds a choice that says nothing."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk_event("hello"))
        await response.write(chunk_event("", "stop"))
        await response.write(sse(usage_chunk))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return handle


LITELLM_USAGE = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": {}}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}


@pytest.mark.parametrize("usage_chunk", [
    pytest.param(LITELLM_USAGE, id="litellm-empty-delta"),
    pytest.param({**LITELLM_USAGE, "choices": [{"index": 0, "delta": {"content": None, "role": None},
                                                "finish_reason": None, "logprobs": None}]}, id="null-fields"),
])
async def test_a_usage_chunk_with_an_empty_choice_is_removed_unless_asked_and_still_counted(
        upstreams, proxy, usage_chunk):
    up = await upstreams({"/v1/chat/completions": litellm_handler(usage_chunk)})
    metrics = Metrics({"chat"}, {"up"})
    p = await proxy({"providers": {"up": openai_provider(up.url)},
                     "routes": {"chat": {"targets": [{"provider": "up", "model": "m"}]}}}, observers=[metrics])
    client = openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="k", max_retries=0)
    try:
        chunks = [c async for c in await client.chat.completions.create(model="chat", messages=CHAT["messages"],
                                                                        stream=True)]
        assert [c.usage for c in chunks] == [None, None]  # the text and the finish, no usage chunk
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello"
        asked = [c async for c in await client.chat.completions.create(
            model="chat", messages=CHAT["messages"], stream=True, stream_options={"include_usage": True})]
        assert asked[-1].usage is not None and asked[-1].usage.completion_tokens == 6
    finally:
        await client.close()
    rendered = metrics.render()[0].decode()
    assert 'firstbyte_tokens_total{kind="completion",target="up"} 12' in rendered  # both calls counted


def test_usage_riding_on_a_chunk_with_content_is_cut_from_it_unless_asked() -> None:
    from proxy.translate.usage_taps import OpenAIUsageTap

    last = {"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    tap = OpenAIUsageTap(keep_usage_chunk=False)
    out = tap.feed(_sse(last) + b"data: [DONE]\n\n")
    assert out == _sse({"choices": last["choices"]}) + b"data: [DONE]\n\n"
    assert tap.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    kept = OpenAIUsageTap(keep_usage_chunk=True)
    assert kept.feed(_sse(last)) == _sse(last)
