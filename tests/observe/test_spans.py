"""The span writer on finished records: what each span says, decoded with ``opentelemetry-proto``.

The parts of a span a route, status, outcome and race role decide are encoded once and reused
(``proxy/observe/spans.py``); these records share and vary those parts on purpose."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from proxy.observe import Finished
from proxy.observe.spans import SpanWriter
from proxy.routing.decision import Attempt, Decision, Excluded, Racer, Ranked
from proxy.traceparent import TraceContext
from tests.conftest import make_config, openai_provider, route_config


def _decode(raw: bytes) -> tuple[Span, dict[str, Any]]:
    span = Span.FromString(raw)
    out: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.values] if kind == "array_value" else value
    return span, out


def _finished(attempts: tuple[Attempt, ...], race: tuple[Racer, ...], started: list[tuple[str, int, float]],
              status: int = 200, served: str | None = "a") -> Finished:
    ctx = TraceContext(0xABC, None, True, None, t0=100.0, span_id=0x77)
    ctx.attempts.extend(started)
    d = Decision("rid1", "chat", "fastest", (Ranked("a", "fastest", 0.1), Ranked("b")), (Excluded("c", "breaker"),),
                 attempts, served, status, {"prompt_tokens": 3, "completion_tokens": 2}, None, race)
    return Finished(d, 1000.0, "127.0.0.1", "POST", "/v1/chat/completions", status, "chat", False, 0.2, 0.5, 10,
                    None if status < 400 else "upstream_error", None, None, ctx)


RACED = ((Attempt("a", "200", 0.3, ttfc=0.1), Attempt("b", "lost", 0.2)),
         (Racer("a", "leader"), Racer("b", "hedge 0.05s")))


@pytest.mark.parametrize(("record", "want"), [
    pytest.param(_finished(*RACED, [("a", 0x11, 100.0), ("b", 0x12, 100.05)]),
                 [("a", 0x11, "leader", "200", None), ("b", 0x12, "hedge 0.05s", "lost", None)], id="race"),
    pytest.param(_finished(*RACED, [("a", 0x21, 100.0), ("b", 0x22, 100.05)]),
                 [("a", 0x21, "leader", "200", None), ("b", 0x22, "hedge 0.05s", "lost", None)],
                 id="the-same-race-again-its-own-ids"),
    pytest.param(_finished((Attempt("a", "503", 0.1, failover=True), Attempt("b", "200", 0.2, ttfc=0.1)), (),
                           [("a", 0x31, 100.0), ("b", 0x32, 100.1)], served="b"),
                 [("a", 0x31, None, "503", "503"), ("b", 0x32, None, "200", None)], id="failover"),
    pytest.param(_finished((Attempt("a", "reset", 0.1),), (), [], status=502, served=None),
                 [("a", None, None, "reset", "reset")], id="never-started-a-new-id"),
])
def test_each_attempt_has_its_id_role_and_outcome(record: Finished, want: list[tuple[Any, ...]]) -> None:
    writer = SpanWriter(make_config(route_config([{"provider": "up", "model": "m-up"}],
                                                 {"up": openai_provider("http://127.0.0.1:9")})))
    writer.spans(record)  # the heads encoded once, then reused for the record below
    request_raw, *attempt_raw = writer.spans(record)
    request, ra = _decode(request_raw)
    assert request.span_id == (0x77).to_bytes(8, "big") and request.parent_span_id == b""
    assert ra["firstbyte.order"] == ["a", "b"] and ra["firstbyte.excluded"] == ["c(breaker)"]
    assert ra["http.response.status_code"] == record.status
    assert (request.status.code == Status.STATUS_CODE_ERROR) == (record.status >= 500)
    got = []
    for raw in attempt_raw:
        span, aa = _decode(raw)
        assert span.parent_span_id == request.span_id and span.trace_id == (0xABC).to_bytes(16, "big")
        span_id = int.from_bytes(span.span_id, "big")
        got.append((aa["firstbyte.target"], span_id if span_id < 0x100 else None, aa.get("firstbyte.race.role"),
                    aa["firstbyte.attempt.outcome"], aa.get("error.type")))
        assert (span.status.code == Status.STATUS_CODE_ERROR) == (aa.get("error.type") is not None)
        assert ("gen_ai.usage.output_tokens" in aa) == (aa["firstbyte.target"] == record.decision.served)
    assert got == want
