"""OpenTelemetry traces from finished exchanges: one span per request, a child per attempt.

Needs the ``otel`` extra (``pip install 'firstbyte[otel]'``); the hub imports this module only
when ``tracing`` is set. Spans are built after the answer, like every observer's work, from the
Decision and the ids the request path chose (``proxy/traceparent.py``: the attempt span ids
are the ones its upstream already saw in ``traceparent``), with their real start and end times.
They are handed to the SDK's batch processor, whose own thread encodes and sends them over
OTLP/HTTP: a slow or dead collector fills a bounded queue and spans are dropped, while no
request waits.

Names and attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``):
the request span is ``{operation} {route}`` (kind server), an attempt ``{operation} {upstream
model}`` (kind client) with its provider; the routing record rides along as ``firstbyte.*``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from yarl import URL

from ..config import Config, Tracing
from ..routing.decision import RACE_WORDS, Attempt, Decision
from ..traceparent import TraceContext
from . import Finished

__all__ = ["Traces"]

log = logging.getLogger("firstbyte")

EXPORT_TIMEOUT = 5.0  # seconds one export may take, in the exporter's thread
CLOSE_WAIT = 2.0  # seconds a stop waits for the last spans to go out
# firstbyte's operations as gen_ai.operation.name says them
OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat", "completions": "text_completion",
              "embeddings": "embeddings"}
PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "azure": "azure.ai.openai",
             "simulated": "firstbyte.simulated"}
_NS = 1_000_000_000


class _Chosen(IdGenerator):
    """The SDK's id source, told each id in turn: the ids were chosen on the request path, where
    the upstream already received them in ``traceparent``."""

    def __init__(self) -> None:
        self.span_id = 0
        self.trace_id = 0

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id


class Traces:
    """Observer: finished exchanges with a sampled trace become spans, exported off the loop."""

    def __init__(self, tracing: Tracing, config: Config | None = None) -> None:
        self.tracing = tracing
        self._targets: dict[str, tuple[str, str, str]] = {}
        if config is not None:
            self.reconfigure(config)
        self._ids = _Chosen()
        exporter = OTLPSpanExporter(endpoint=tracing.otlp, timeout=EXPORT_TIMEOUT)
        self._processor = BatchSpanProcessor(exporter, max_queue_size=tracing.queue, schedule_delay_millis=500,
                                             max_export_batch_size=min(512, tracing.queue),
                                             export_timeout_millis=EXPORT_TIMEOUT * 1000)
        self._provider = TracerProvider(sampler=ALWAYS_ON, id_generator=self._ids, shutdown_on_exit=False,
                                        resource=Resource.create({"service.name": tracing.service_name}))
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("firstbyte")

    def reconfigure(self, config: Config) -> None:
        """Each target's upstream model, provider kind and base URL, for its attempt spans."""
        self._targets = {}
        for route in config.routes.values():
            for t in route.targets:
                provider = config.providers[t.provider]
                self._targets.setdefault(t.name, (t.model, provider.kind, provider.base_url or ""))

    def on_finished(self, finished: Finished) -> None:
        ctx = finished.trace
        if ctx is None or not ctx.sampled:
            return
        start = int(finished.started * _NS)
        end = start + int(finished.total * _NS)
        request = self._request_span(finished, ctx, start)
        d = finished.decision
        if d is not None:
            parent = trace.set_span_in_context(request, Context())
            for attempt, span_id, began in _paired(d, ctx):
                t0 = start if began is None else start + int((began - ctx.t0) * _NS)
                self._attempt_span(finished, d, attempt, span_id, parent, t0, end)
        request.end(end)

    def _request_span(self, f: Finished, ctx: TraceContext, start: int) -> Any:
        d = f.decision
        op = OPERATIONS.get(f.operation, f.operation or "chat")
        route = d.route if d is not None else (f.asked or "")
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op, "gen_ai.request.model": route, "http.request.method": f.method,
            "url.path": f.path, "http.response.status_code": f.status, "client.address": f.client,
            "firstbyte.request_id": d.id if d is not None else (f.request_id or ""), "firstbyte.stream": f.stream,
        }
        if d is not None:
            attrs.update({
                "firstbyte.route": d.route, "firstbyte.strategy": d.strategy, "firstbyte.decision": d.header(),
                "firstbyte.order": [r.name for r in d.order], "firstbyte.first_reason": d.first_reason,
                "firstbyte.excluded": [f"{e.name}({e.reason})" for e in d.excluded],
                "firstbyte.failovers": d.failovers,
            })
            if d.served:
                attrs["firstbyte.served"] = d.served
            attrs.update(_usage(d))
        if f.ttfc is not None:
            attrs["firstbyte.time_to_first_byte_s"] = round(f.ttfc, 6)
        if f.status >= 400:
            attrs["error.type"] = f.error or str(f.status)
        parent = Context()
        if ctx.parent_id is not None:
            remote = SpanContext(ctx.trace_id, ctx.parent_id, is_remote=True, trace_flags=TraceFlags(1))
            parent = trace.set_span_in_context(NonRecordingSpan(remote), parent)
        self._ids.trace_id, self._ids.span_id = ctx.trace_id, ctx.span_id
        span = self._tracer.start_span(f"{op} {route}", parent, SpanKind.SERVER, attrs, start_time=start)
        if f.status >= 500:
            span.set_status(Status(StatusCode.ERROR, f.error or str(f.status)))
        return span

    def _attempt_span(self, f: Finished, d: Decision, a: Attempt, span_id: int, parent: Context, start: int,
                      request_end: int) -> None:
        model, kind, base_url = self._targets.get(a.name, ("", "", ""))
        op = OPERATIONS.get(f.operation, f.operation or "chat")
        system = PROVIDERS.get(kind, kind or "unknown")
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op, "gen_ai.request.model": model or a.name, "gen_ai.provider.name": system,
            "gen_ai.system": system, "firstbyte.target": a.name, "firstbyte.attempt.outcome": a.outcome,
            "firstbyte.attempt.failover": a.failover,
        }
        if base_url:
            url = URL(base_url)
            attrs["server.address"], attrs["server.port"] = url.host or "", url.port or 0
        if a.outcome.isdigit():
            attrs["http.response.status_code"] = int(a.outcome)
        if a.ttfc is not None:
            attrs["firstbyte.time_to_first_token_s"] = round(a.ttfc, 6)
        for name, role in d.race:
            if name == a.name:
                attrs["firstbyte.race.role"] = role
        served = a.name == d.served and a.ttfc is not None
        # a racer's end (lost, measured…) is no failure; a status from 400 up and a failure word are
        failed = int(a.outcome) >= 400 if a.outcome.isdigit() else a.outcome not in RACE_WORDS
        if served:
            attrs["gen_ai.response.model"] = model or a.name
            attrs.update(_usage(d))
        elif failed:
            attrs["error.type"] = a.outcome
        self._ids.span_id = span_id
        span = self._tracer.start_span(f"{op} {model or a.name}", parent, SpanKind.CLIENT, attrs, start_time=start)
        if failed:
            span.set_status(Status(StatusCode.ERROR, a.outcome))
        # The served attempt goes on until the answer has been relayed; the others end when settled.
        end = max(request_end, start) if served else start + int(a.seconds * _NS)
        span.end(end)

    async def close(self) -> None:
        """Send what is queued, waiting at most CLOSE_WAIT: a dead collector does not hold up a stop."""
        try:
            await asyncio.wait_for(asyncio.to_thread(self._provider.shutdown), CLOSE_WAIT)
        except TimeoutError:
            log.warning("tracing: the collector at %s did not take the last spans in %.0fs",
                        self.tracing.otlp, CLOSE_WAIT)


def _usage(d: Decision) -> dict[str, int]:
    out = {}
    for ours, theirs in (("prompt_tokens", "gen_ai.usage.input_tokens"),
                         ("completion_tokens", "gen_ai.usage.output_tokens")):
        count = d.usage.get(ours)
        if isinstance(count, int):
            out[theirs] = count
    return out


def _paired(d: Decision, ctx: TraceContext) -> Iterator[tuple[Attempt, int, float | None]]:
    """Each attempt of the decision with the span id and start the walker gave it: by target, in
    order (one target's tries are sequential, whatever races beside them). An attempt the walker
    never started (a request the target's API cannot express) gets a new id and no start."""
    started: dict[str, list[tuple[int, float]]] = {}
    for name, span_id, began in ctx.attempts:
        started.setdefault(name, []).append((span_id, began))
    for a in d.attempts:
        mine = started.get(a.name)
        if mine:
            span_id, began = mine.pop(0)
            yield a, span_id, began
        else:
            yield a, ctx.new_span_id(), None
