"""W3C traceparent parsing and the header each attempt sends upstream."""

from __future__ import annotations

import pytest

from proxy.providers.base import UpstreamRequest
from proxy.traceparent import begin, parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param(f"00-{TRACE}-{SPAN}-01", (int(TRACE, 16), int(SPAN, 16), True), id="sampled"),
    pytest.param(f"00-{TRACE}-{SPAN}-00", (int(TRACE, 16), int(SPAN, 16), False), id="not-sampled"),
    pytest.param(f"00-{TRACE.upper()}-{SPAN}-01", (int(TRACE, 16), int(SPAN, 16), True), id="upper-case-read"),
    pytest.param(f"01-{TRACE}-{SPAN}-09-more", (int(TRACE, 16), int(SPAN, 16), True), id="future-version-tail"),
    pytest.param(f"00-{TRACE}-{SPAN}-01-more", None, id="version-00-with-a-tail"),
    pytest.param(f"ff-{TRACE}-{SPAN}-01", None, id="version-ff"),
    pytest.param(f"00-{'0' * 32}-{SPAN}-01", None, id="zero-trace-id"),
    pytest.param(f"00-{TRACE}-{'0' * 16}-01", None, id="zero-parent-id"),
    pytest.param(f"00-{TRACE[:-1]}-{SPAN}-01", None, id="short-trace-id"),
    pytest.param("", None, id="empty"),
    pytest.param(None, None, id="absent"),
])
def test_parse_traceparent(value: str | None, expected: tuple[int, int, bool] | None) -> None:
    assert parse_traceparent(value) == expected


def test_each_attempt_gets_its_own_span_id_in_the_callers_trace() -> None:
    ctx = begin({"traceparent": f"00-{TRACE}-{SPAN}-01"}, 0.0, t0=5.0)  # sample 0: the caller decides
    assert ctx is not None
    request = UpstreamRequest("POST", "http://u/v1/chat/completions", {"content-type": "application/json"}, b"{}")
    first, second = ctx.attempt("a", 5.1, request), ctx.attempt("b", 5.2, request)
    assert "traceparent" not in request.headers  # the shared request is not changed
    ids = [parse_traceparent(r.headers["traceparent"]) for r in (first, second)]
    assert [i[0] for i in ids if i] == [int(TRACE, 16)] * 2
    assert [(name, f"{span:016x}", at) for name, span, at in ctx.attempts] == [
        ("a", first.headers["traceparent"][36:52], 5.1), ("b", second.headers["traceparent"][36:52], 5.2)]
    assert len({ctx.span_id, *(span for _, span, _ in ctx.attempts)}) == 3


def test_a_new_trace_is_started_by_the_sample() -> None:
    ctx = begin({}, 1.0, t0=0.0)
    assert ctx is not None and ctx.parent_id is None and ctx.sampled and ctx.trace_id
    assert begin({}, 0.0, t0=0.0) is None  # left out: no ids, no traceparent upstream
    unsampled_caller = begin({"traceparent": f"00-{TRACE}-{SPAN}-00"}, 1.0, t0=0.0)
    assert unsampled_caller is not None and not unsampled_caller.sampled  # the caller's context goes on


def test_a_callers_unsampled_trace_is_carried_on_as_it_came_with_nothing_drawn_or_kept() -> None:
    ctx = begin({"traceparent": f"00-{TRACE}-{SPAN}-00", "tracestate": "v=1"}, 1.0, t0=0.0)
    assert ctx is not None
    request = UpstreamRequest("POST", "http://u/v1/chat/completions", {"content-type": "application/json"}, b"{}")
    sent = ctx.attempt("a", 0.1, request)
    assert sent.headers["traceparent"] == f"00-{TRACE}-{SPAN}-00" and sent.headers["tracestate"] == "v=1"
    assert ctx.attempts == []  # no span of it is ever written: nothing to pair
