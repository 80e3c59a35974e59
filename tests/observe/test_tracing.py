"""OpenTelemetry traces over the real wire: firstbyte on loopback, a fake upstream, and a loopback
OTLP/HTTP receiver that decodes what arrives with ``opentelemetry-proto``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from proxy.gateway import Gateway
from proxy.observe.hub import Hub
from proxy.server.app import build_app
from proxy.traceparent import parse_traceparent
from tests.conftest import (
    FakeUpstream,
    make_config,
    ok_handler,
    openai_provider,
    route_config,
    serve_on_loopback,
    status_handler,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class Collector:
    """An OTLP/HTTP traces endpoint on loopback: every span it is sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []  # (resource attributes, span)
        self.posts: list[int] = []  # spans per export, in arrival order
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.headers["content-type"] == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        self.posts.append(sum(len(ss.spans) for rs in export.resource_spans for ss in rs.scope_spans))
        for rs in export.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                self.spans.extend((resource, span) for span in ss.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def start(self) -> Collector:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner, base = await serve_on_loopback(app, shutdown_timeout=0.5)
        self.url = base + "/v1/traces"
        return self

    async def wait_for(self, trace_id: str, count: int, timeout: float = 10.0) -> list[Span]:
        """The spans of one trace, once ``count`` of them arrived (the exporter batches every 0.5 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [s for _, s in self.spans if s.trace_id.hex() == trace_id]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.05)
        raise AssertionError(f"{count} spans of trace {trace_id} never arrived; got {self.spans}")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def attrs(span: Span) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in span.attributes}


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    c = await Collector().start()
    yield c
    assert c.runner is not None
    await c.runner.cleanup()


async def traced_gateway(raw: dict[str, Any]) -> tuple[Hub, web.AppRunner, str]:
    config = make_config(raw)
    hub = Hub(config)
    gw = Gateway(config, observers=hub.observers)
    runner, url = await serve_on_loopback(build_app(gw, hub), shutdown_timeout=1)
    return hub, runner, url


async def chat(url: str, headers: dict[str, str] | None = None, model: str = "chat") -> tuple[int, dict[str, str]]:
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", headers=headers or {},
                                                     json={"model": model, "messages": [
                                                         {"role": "user", "content": "hi"}]}) as r:
        await r.read()
        return r.status, dict(r.headers)


async def test_a_failover_is_one_request_span_with_an_attempt_span_each_and_traceparent_reaches_upstream(
        collector: Collector, upstreams: Any) -> None:
    down: FakeUpstream = await upstreams({"*": status_handler(503, "overloaded")})
    up: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    raw = route_config([{"provider": "down", "model": "m-down"}, {"provider": "up", "model": "m-up"}],
                       {"down": openai_provider(down.url), "up": openai_provider(up.url)})
    raw["tracing"] = {"otlp": collector.url, "service_name": "gw-test"}
    hub, runner, url = await traced_gateway(raw)
    try:
        status, headers = await chat(url, {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "vendor=1"})
        assert status == 200
        spans = await collector.wait_for(TRACE, 3)
    finally:
        await runner.cleanup()
        await hub.close()

    (request,) = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    assert request.parent_span_id.hex() == PARENT  # the caller's span is honoured as the parent
    assert request.name == "chat chat"
    a = attrs(request)
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "chat"
    assert a["gen_ai.usage.input_tokens"] == 3 and a["gen_ai.usage.output_tokens"] == 1
    assert a["firstbyte.order"] == ["down", "up"] and a["firstbyte.served"] == "up"
    assert a["firstbyte.decision"] == headers["x-route-decision"]
    assert a["http.response.status_code"] == 200
    assert request.end_time_unix_nano > request.start_time_unix_nano

    attempts = sorted((s for s in spans if s.kind == Span.SPAN_KIND_CLIENT), key=lambda s: s.start_time_unix_nano)
    assert [s.parent_span_id for s in attempts] == [request.span_id, request.span_id]
    failed, served = attempts
    assert failed.name == "chat m-down" and served.name == "chat m-up"
    fa, sa = attrs(failed), attrs(served)
    assert fa["gen_ai.request.model"] == "m-down" and fa["gen_ai.provider.name"] == "openai"
    assert fa["firstbyte.attempt.outcome"] == "503" and fa["error.type"] == "503"
    assert failed.status.code == Status.STATUS_CODE_ERROR
    assert sa["gen_ai.response.model"] == "m-up" and sa["gen_ai.usage.output_tokens"] == 1
    assert sa["firstbyte.time_to_first_token_s"] > 0 and sa["server.address"] == "127.0.0.1"
    assert served.status.code != Status.STATUS_CODE_ERROR
    assert request.start_time_unix_nano <= failed.start_time_unix_nano <= served.start_time_unix_nano
    assert served.start_time_unix_nano >= failed.end_time_unix_nano

    # Each upstream got its own attempt's span as parent, in the caller's trace, with its tracestate.
    for upstream, span in ((down, failed), (up, served)):
        (call,) = upstream.calls
        assert call["headers"]["traceparent"] == f"00-{TRACE}-{span.span_id.hex()}-01"
        assert call["headers"]["tracestate"] == "vendor=1"
    assert {r["service.name"] for r, _ in collector.spans} == {"gw-test"}


async def test_a_new_trace_when_none_came_and_none_exported_when_the_caller_does_not_sample(
        collector: Collector, upstreams: Any) -> None:
    up: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    raw = route_config([{"provider": "up", "model": "m-up"}], {"up": openai_provider(up.url)})
    raw["tracing"] = {"otlp": collector.url, "sample": 1.0}
    hub, runner, url = await traced_gateway(raw)
    unsampled = "0af7651916cd43dd8448eb211c80319c"
    try:
        assert (await chat(url, {"traceparent": f"00-{unsampled}-b7ad6b7169203331-00"}))[0] == 200
        assert (await chat(url))[0] == 200
        fresh = parse_traceparent(up.calls[1]["headers"]["traceparent"])
        assert fresh is not None and fresh[2]  # sampled: sample 1
        spans = await collector.wait_for(f"{fresh[0]:032x}", 2)
    finally:
        await runner.cleanup()
        await hub.close()
    (request,) = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    assert request.parent_span_id == b""  # a root span
    (attempt,) = [s for s in spans if s.kind == Span.SPAN_KIND_CLIENT]
    assert attempt.span_id.hex() == f"{fresh[1]:016x}"
    # the unsampled caller's trace went upstream as it came (flags 00), and no span of it was sent
    assert up.calls[0]["headers"]["traceparent"].startswith(f"00-{unsampled}-")
    assert up.calls[0]["headers"]["traceparent"].endswith("-00")
    assert not [s for _, s in collector.spans if s.trace_id.hex() == unsampled]


async def test_a_collector_that_never_answers_costs_requests_nothing(upstreams: Any) -> None:
    """The collector accepts the connection and then says nothing: requests answer as fast as
    ever, and stopping waits a bounded time for it."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    black_hole = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = black_hole.sockets[0].getsockname()[1]
    up: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    raw = route_config([{"provider": "up", "model": "m-up"}], {"up": openai_provider(up.url)})
    raw["tracing"] = {"otlp": f"http://127.0.0.1:{port}/v1/traces", "queue": 64, "sample": 1.0}
    hub, runner, url = await traced_gateway(raw)
    try:
        took = []
        for _ in range(150):  # more spans than the queue holds: the rest are dropped, not waited for
            t0 = time.monotonic()
            assert (await chat(url))[0] == 200
            took.append(time.monotonic() - t0)
        assert max(took) < 0.5, max(took)
        assert hub.traces is not None and hub.traces.dropped > 0  # the queue of 64 was full: dropped
    finally:
        await runner.cleanup()
        t0 = time.monotonic()
        await hub.close()
        assert time.monotonic() - t0 < 4.0
        for writer in held:
            writer.close()
        black_hole.close()


async def test_requests_that_share_a_route_and_outcome_each_keep_their_own_ids_and_figures(
        collector: Collector, upstreams: Any) -> None:
    """The parts of a span a route, status and outcome decide are encoded once and reused: what
    differs per request (request id, decision header, ids, times) is each request's own, and a
    different status makes a different span."""
    up: FakeUpstream = await upstreams({"/ok/v1/chat/completions": ok_handler("hi"),
                                        "/down/v1/chat/completions": status_handler(400, "bad")})
    raw = route_config([{"provider": "up", "model": "m-up"}], {"up": openai_provider(up.url + "/ok")})
    raw["providers"]["down"] = openai_provider(up.url + "/down")
    raw["routes"]["bad"] = {"targets": [{"provider": "down", "model": "m-down"}]}
    raw["tracing"] = {"otlp": collector.url}
    hub, runner, url = await traced_gateway(raw)
    traces = [f"{n:032x}" for n in range(1, 4)]
    try:
        answers = [await chat(url, {"traceparent": f"00-{trace}-{PARENT}-01"}, model=model)
                   for trace, model in zip(traces, ("chat", "chat", "bad"), strict=True)]
        found = [await collector.wait_for(trace, 2) for trace in traces]
    finally:
        await runner.cleanup()
        await hub.close()
    assert [status for status, _ in answers] == [200, 200, 400]
    pairs = []
    for (_, headers), spans, trace in zip(answers, found, traces, strict=True):
        (request,) = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
        (attempt,) = [s for s in spans if s.kind == Span.SPAN_KIND_CLIENT]
        a = attrs(request)
        assert headers["x-route-decision"].startswith(f"id={a['firstbyte.request_id']};")
        assert a["firstbyte.decision"] == headers["x-route-decision"]
        assert attempt.parent_span_id == request.span_id and request.trace_id.hex() == trace
        pairs.append((request, attempt))
    assert len({request.span_id for request, _ in pairs} | {attempt.span_id for _, attempt in pairs}) == 6
    ok, bad = attrs(pairs[1][0]), pairs[2][1]
    assert ok["http.response.status_code"] == 200 and "error.type" not in ok
    assert attrs(pairs[2][0])["http.response.status_code"] == 400
    assert attrs(bad)["error.type"] == "400" and bad.status.code == Status.STATUS_CODE_ERROR
    assert bad.name == "chat m-down"


async def _load(url: str, workers: int, each: int) -> None:
    async with aiohttp.ClientSession() as s:
        async def calls() -> None:
            for _ in range(each):
                async with s.post(url + "/v1/chat/completions", json={
                        "model": "chat", "messages": [{"role": "user", "content": "hi"}]}) as r:
                    assert r.status == 200
                    await r.read()

        await asyncio.gather(*(calls() for _ in range(workers)))


@pytest.mark.parametrize(("requests", "posts"), [
    pytest.param(256, 1, id="one-batch"),
    pytest.param(640, 2, id="a-steady-stream-makes-full-batches"),
])
async def test_full_batches_are_posted_at_once_not_at_the_next_tick(
        collector: Collector, upstreams: Any, requests: int, posts: int) -> None:
    """``export_every: 60``: each batch of 512 spans (256 requests of two spans) goes at once, so a
    busy gateway's queue never fills between two ticks; what comes in while a post is out waits
    for the next full batch (no post per few requests), and the rest goes at the stop."""
    up: FakeUpstream = await upstreams({"*": ok_handler("hi")})
    raw = route_config([{"provider": "up", "model": "m-up"}], {"up": openai_provider(up.url)})
    raw["tracing"] = {"otlp": collector.url, "export_every": 60, "sample": 1.0}
    hub, runner, url = await traced_gateway(raw)
    try:
        await _load(url, 8, requests // 8)
        deadline = time.monotonic() + 20
        while len(collector.posts) < posts and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert len(collector.posts) == posts and min(collector.posts) >= 512, collector.posts
    finally:
        await runner.cleanup()
        await hub.close()
    assert sum(collector.posts) == 2 * requests  # the stop sent what was left
