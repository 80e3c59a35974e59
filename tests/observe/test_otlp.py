"""The hand-written OTLP protobuf, decoded by the schema's own classes (opentelemetry-proto)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from proxy.observe.otlp import CLIENT, ERROR, attr, export_request, known, scope, seconds, span


def decoded(field_and_pair: bytes) -> tuple[str, Any]:
    """An attribute written as Span field 9: strip the field's tag and length, decode the KeyValue."""
    span_bytes = Span.FromString(field_and_pair)
    (kv,) = span_bytes.attributes
    value = kv.value
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return kv.key, [v.string_value for v in value.array_value.values]
    return kv.key, getattr(value, kind)


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("chat", "chat", id="string"),
    pytest.param("é→✓ " * 100, "é→✓ " * 100, id="long-unicode-string"),
    pytest.param(True, True, id="bool"),
    pytest.param(0, 0, id="zero"),
    pytest.param(300, 300, id="int-two-byte-varint"),
    pytest.param(-5, -5, id="negative-int"),
    pytest.param(2**62, 2**62, id="large-int"),
    pytest.param(0.125, 0.125, id="double"),
    pytest.param(("a", "b/c"), ["a", "b/c"], id="array"),
])
def test_an_attribute_of_each_kind(value: Any, expected: Any) -> None:
    assert decoded(attr("k.e-y", value)) == ("k.e-y", expected)


def test_known_keeps_true_and_1_apart_and_seconds_is_a_double() -> None:
    assert decoded(known("x", True)) == ("x", True)
    assert decoded(known("x", 1)) == ("x", 1)
    assert decoded(seconds("t", 1.5)) == ("t", 1.5)
    assert decoded(seconds("t", 0.001)) == ("t", 0.001)


def test_a_span_in_an_export_request() -> None:
    trace = (0x4BF92F3577B34DA6A3CE929D0E0E4736).to_bytes(16, "big")
    body = span(trace, 0x00F067AA0BA902B7, 0x1122334455667788, "chat m-1", CLIENT, 1_000_000_000, 2_500_000_000,
                attr("a", "b") + attr("n", 3), (ERROR, "503"), "vendor=1")
    request = ExportTraceServiceRequest.FromString(
        export_request(attr("service.name", "gw", 1), scope("firstbyte", "1.2"), [body, body]))
    (rs,) = request.resource_spans
    assert rs.resource.attributes[0].key == "service.name" and rs.resource.attributes[0].value.string_value == "gw"
    (ss,) = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == ("firstbyte", "1.2")
    first, second = ss.spans
    assert first == second
    assert first.trace_id == trace and first.span_id.hex() == "00f067aa0ba902b7"
    assert first.parent_span_id.hex() == "1122334455667788" and first.trace_state == "vendor=1"
    assert (first.name, first.kind) == ("chat m-1", Span.SPAN_KIND_CLIENT)
    assert (first.start_time_unix_nano, first.end_time_unix_nano) == (1_000_000_000, 2_500_000_000)
    assert [(kv.key, kv.value.WhichOneof("value")) for kv in first.attributes] == [("a", "string_value"),
                                                                                  ("n", "int_value")]
    assert (first.status.code, first.status.message) == (2, "503")
