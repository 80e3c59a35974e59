"""W3C trace context on the request path: read the caller's ``traceparent``, stamp each attempt's.

This is all tracing costs a request while it runs: a header parsed, a few random ids, and
one header added to each upstream call, so the upstream's own spans hang under ours. The
spans themselves are built after the answer, from the finished exchange, by
``proxy/observe/tracing.py``; nothing here imports OpenTelemetry.

An incoming ``traceparent`` is honoured: its trace id is kept, its span becomes the request
span's parent, and its sampled flag decides whether the trace is exported (a caller that
does not record the trace gets none from us either, but its context still goes upstream). Without
one, a new trace is started with probability ``tracing.sample``; a request left out carries no ids.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping

from .upstream.transport import UpstreamRequest

__all__ = ["TraceContext", "begin", "parse_traceparent"]

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_TRACESTATE = re.compile(r"^[\x20-\x7e]{1,512}$")
_ids = random.Random()  # ids need to be unique, not secret (as request ids)
# A worker forked from the supervisor (forked.py) draws its own: the sequence was each worker's alike.
os.register_at_fork(after_in_child=_ids.seed)


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) from a ``traceparent`` header, or None when it is
    absent or invalid (W3C: version ``ff``, all-zero ids and a version-00 tail are invalid)."""
    if not value:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if m is None:
        return None
    version, trace, parent, flags, tail = m.groups()
    if version == "ff" or (version == "00" and tail):
        return None
    trace_id, parent_id = int(trace, 16), int(parent, 16)
    if not trace_id or not parent_id:
        return None
    return trace_id, parent_id, bool(int(flags, 16) & 1)


class TraceContext:
    """One request's trace: its ids, and the span id and start of each upstream attempt.

    The walker calls :meth:`attempt` once per try; the tracing observer later pairs those with
    the decision's attempts (by target, in order) to give each its span. A caller's trace that it
    does not sample is only carried on: every attempt sends the caller's own ``traceparent``
    (``forward``), with no ids drawn and nothing recorded, since no span of it is ever written."""

    __slots__ = ("attempts", "forward", "parent_id", "sampled", "span_id", "t0", "trace_id", "tracestate")

    def __init__(self, trace_id: int, parent_id: int | None, sampled: bool, tracestate: str | None,
                 t0: float, span_id: int = 0) -> None:
        self.t0 = t0  # the request's arrival on the gateway's clock, which attempt starts are read on
        self.trace_id = trace_id
        self.parent_id = parent_id  # the caller's span, when it sent a traceparent
        self.span_id = span_id or (self.new_span_id() if sampled else 0)  # the request's span
        self.sampled = sampled
        self.tracestate = tracestate
        self.attempts: list[tuple[str, int, float]] = []  # (target, span id, monotonic start)
        self.forward = None if sampled else f"00-{trace_id:032x}-{parent_id or 0:016x}-00"

    @staticmethod
    def new_span_id() -> int:
        return _ids.getrandbits(64) or 1

    def attempt(self, target: str, started: float, request: UpstreamRequest) -> UpstreamRequest:
        """``request`` with this attempt's ``traceparent`` (and the caller's ``tracestate``)."""
        headers = dict(request.headers)
        if self.forward is None:
            span_id = _ids.getrandbits(64) or 1
            self.attempts.append((target, span_id, started))
            headers["traceparent"] = f"00-{self.trace_id:032x}-{span_id:016x}-01"
        else:
            headers["traceparent"] = self.forward
        if self.tracestate is not None:
            headers["tracestate"] = self.tracestate
        return UpstreamRequest(request.method, request.url, headers, request.body, request.extra)


def begin(headers: Mapping[str, str], sample: float, t0: float) -> TraceContext | None:
    """The trace a request joins (its caller's) or starts (kept with probability ``sample``);
    ``t0``: its arrival on the gateway's clock. None for a new trace the sample leaves out: with
    no caller to carry it on for and nothing to record, the request goes on as if untraced."""
    value = headers.get("traceparent")
    parsed = parse_traceparent(value) if value else None
    if parsed is None:
        if sample < 1.0 and _ids.random() >= sample:
            return None
        ids = _ids.getrandbits(192)  # the trace's 128 bits and the request span's 64, in one draw
        return TraceContext(ids >> 64 or 1, None, True, None, t0, ids & _SPAN_BITS)
    trace_id, parent_id, sampled = parsed
    state = headers.get("tracestate")
    return TraceContext(trace_id, parent_id, sampled, state if state and _TRACESTATE.match(state) else None, t0)


_SPAN_BITS = (1 << 64) - 1
