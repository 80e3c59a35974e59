"""One finished exchange as OTLP ``Span`` messages: the request's and one per attempt, as bytes.

The exporter's task calls :meth:`SpanWriter.spans` for each record of a batch just before it
posts it, so the request path only queued the record (``tracing.py``). Most of a span does not
change from request to request: its name, its kind and the attributes a route, a status or an
outcome word decide. Those parts are encoded once and kept in a small table keyed by the values
that decide them; what is left per span is its ids, times, the request's id and decision header,
the durations and the token counts (docs/adr/0012, amended).

Names and attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``):
the request span is ``{operation} {route}`` (kind server), an attempt ``{operation} {upstream
model}`` (kind client) with its provider; the routing record rides along as ``firstbyte.*``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterator

from yarl import URL

from ..config import Config
from ..routing.decision import RACE_WORDS, Attempt, Decision
from ..traceparent import TraceContext
from . import Finished
from .otlp import CLIENT, ERROR, SERVER, assemble, attr, field, known, named, seconds, status

__all__ = ["SpanWriter"]

# firstbyte's operations as gen_ai.operation.name says them
OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat", "completions": "text_completion",
              "embeddings": "embeddings"}
PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "azure": "azure.ai.openai",
             "simulated": "firstbyte.simulated"}
HELD = 4096  # encoded heads kept; past it the table starts again (a reload does too)
_NS = 1_000_000_000
Head = tuple[bytes, tuple[bytes, bytes]]  # (attributes, (name and kind fields, status field))
_USAGE = (("prompt_tokens", "gen_ai.usage.input_tokens"), ("completion_tokens", "gen_ai.usage.output_tokens"))


class SpanWriter:
    """Encodes finished exchanges; knows each target's upstream model and fixed attributes."""

    def __init__(self, config: Config | None = None) -> None:
        self._targets: dict[str, tuple[str, bytes]] = {}  # target: (upstream model, its fixed attributes)
        # the values that decide a head: the head (a request's key has 7 or 13 values, an attempt's 6)
        self._heads: dict[tuple[object, ...], Head] = {}
        if config is not None:
            self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """Each target's upstream model and the attributes that never change for it, encoded once."""
        targets: dict[str, tuple[str, bytes]] = {}
        for route in config.routes.values():
            for t in route.targets:
                if t.name in targets:
                    continue
                provider = config.providers[t.provider]
                system = PROVIDERS.get(provider.kind, provider.kind)
                fixed = (attr("gen_ai.request.model", t.model) + attr("gen_ai.provider.name", system)
                         + attr("gen_ai.system", system) + attr("firstbyte.target", t.name))
                if provider.base_url:
                    url = URL(provider.base_url)
                    fixed += attr("server.address", url.host or "") + attr("server.port", url.port or 0)
                targets[t.name] = (t.model, fixed)
        self._targets = targets
        self._heads = {}

    def spans(self, f: Finished) -> list[bytes]:
        """The request's span and its attempts' (``f.trace`` is set: only traced records are queued)."""
        ctx = f.trace
        assert ctx is not None
        start = int(f.started * _NS)
        end = start + int(f.total * _NS)
        hi, lo = divmod(ctx.trace_id, 1 << 64)
        d = f.decision
        usage = b"" if d is None else _usage(d)
        out = [self._request_span(f, ctx, hi, lo, start, end, usage)]
        if d is not None:
            roles = dict(reversed(d.race)) if d.race else None  # a target's first role, as the header reads
            for attempt, span_id, began in _paired(d, ctx):
                t0 = start if began is None else start + int((began - ctx.t0) * _NS)
                out.append(self._attempt_span(f, d, ctx, hi, lo, attempt, span_id, t0, end, usage, roles))
        return out

    def _hold(self, key: tuple[object, ...], head: Head) -> Head:
        if len(self._heads) >= HELD:
            self._heads = {}
        self._heads[key] = head
        return head

    def _request_span(self, f: Finished, ctx: TraceContext, hi: int, lo: int, start: int, end: int,
                      usage: bytes) -> bytes:
        d = f.decision
        route = d.route if d is not None else (f.asked or "")
        key: tuple[object, ...] = (f.operation, route, f.method, f.path, f.status, f.stream, f.error)
        if d is not None:
            key += (d.strategy, tuple([r.name for r in d.order]), d.first_reason, d.failovers, d.excluded, d.served)
        head = self._heads.get(key)
        if head is None:
            head = self._hold(key, _request_head(f, d, route))
        a = head[0] + usage
        if d is not None:
            a += attr("firstbyte.request_id", d.id) + attr("firstbyte.decision", d.header())
        if f.ttfc is not None:
            a += seconds("firstbyte.time_to_first_byte_s", f.ttfc)
        return assemble(hi, lo, ctx.span_id, ctx.parent_id, _state(ctx.tracestate), head[1][0], start, end, a,
                        head[1][1])

    def _attempt_span(self, f: Finished, d: Decision, ctx: TraceContext, hi: int, lo: int, a: Attempt,
                      span_id: int, start: int, request_end: int, usage: bytes,
                      roles: dict[str, str] | None) -> bytes:
        served = a.name == d.served and a.ttfc is not None
        role = roles.get(a.name) if roles else None
        key = (f.operation, a.name, a.outcome, a.failover, role, served)
        head = self._heads.get(key)
        if head is None:
            head = self._hold(key, self._attempt_head(f.operation, a, role, served))
        b = head[0]
        if a.ttfc is not None:
            b += seconds("firstbyte.time_to_first_token_s", a.ttfc)
        if served:
            b += usage
        # The served attempt goes on until the answer has been relayed; the others end when settled.
        end = max(request_end, start) if served else start + int(a.seconds * _NS)
        return assemble(hi, lo, span_id, ctx.span_id, _state(ctx.tracestate), head[1][0], start, end, b, head[1][1])

    def _attempt_head(self, operation: str, a: Attempt, role: str | None, served: bool) -> Head:
        """An attempt's attributes and (name, status) fields that its target, outcome and role decide."""
        model, fixed = self._targets.get(a.name, ("", attr("firstbyte.target", a.name)))
        op = OPERATIONS.get(operation, operation or "chat")
        b = (known("gen_ai.operation.name", op) + fixed + known("firstbyte.attempt.outcome", a.outcome)
             + known("firstbyte.attempt.failover", a.failover))
        if a.outcome.isdigit():
            b += known("http.response.status_code", int(a.outcome))
        if role is not None:
            b += known("firstbyte.race.role", role)
        # a racer's end (lost, measured…) is no failure; a status from 400 up and a failure word are
        failed = int(a.outcome) >= 400 if a.outcome.isdigit() else a.outcome not in RACE_WORDS
        if served:
            b += known("gen_ai.response.model", model or a.name)
        elif failed:
            b += known("error.type", a.outcome)
        return b, (named(f"{op} {model or a.name}", CLIENT), status(ERROR, a.outcome) if failed else b"")


def _request_head(f: Finished, d: Decision | None, route: str) -> Head:
    """The request span's attributes and (name, status) fields that do not change per request."""
    op = OPERATIONS.get(f.operation, f.operation or "chat")
    a = (known("gen_ai.operation.name", op) + known("gen_ai.request.model", route)
         + known("http.request.method", f.method) + known("url.path", f.path)
         + known("http.response.status_code", f.status) + known("firstbyte.stream", f.stream))
    if d is not None:
        a += (known("firstbyte.route", d.route) + known("firstbyte.strategy", d.strategy)
              + attr("firstbyte.order", [r.name for r in d.order])
              + known("firstbyte.first_reason", d.first_reason) + known("firstbyte.failovers", d.failovers))
        if d.excluded:
            a += attr("firstbyte.excluded", [f"{e.name}({e.reason})" for e in d.excluded])
        if d.served:
            a += known("firstbyte.served", d.served)
    failure = b""
    if f.status >= 400:
        a += known("error.type", f.error or str(f.status))
        if f.status >= 500:  # a server span's error: the gateway's, not the client's
            failure = status(ERROR, f.error or str(f.status))
    return a, (named(f"{op} {route}", SERVER), failure)


@functools.lru_cache(maxsize=64)
def _state(state: str | None) -> bytes:
    """``Span.trace_state`` (field 3) as the caller sent it; most requests have none."""
    return b"" if state is None else field(3, state.encode())


def _usage(d: Decision) -> bytes:
    out = b""
    for ours, theirs in _USAGE:
        count = d.usage.get(ours)
        if isinstance(count, int):
            out += known(theirs, count)
    return out


def _paired(d: Decision, ctx: TraceContext) -> Iterator[tuple[Attempt, int, float | None]]:
    """Each attempt of the decision with the span id and start the walker gave it: by target, in
    order (one target's tries are sequential, whatever races beside them). An attempt the walker
    never started (a request the target's API cannot express) gets a new id and no start."""
    started: dict[str, deque[tuple[int, float]]] = {}
    for name, span_id, began in ctx.attempts:
        started.setdefault(name, deque()).append((span_id, began))
    for a in d.attempts:
        mine = started.get(a.name)
        if mine:
            span_id, began = mine.popleft()
            yield a, span_id, began
        else:
            yield a, ctx.new_span_id(), None
