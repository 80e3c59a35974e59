"""OTLP trace protobuf, written by hand: the few messages a span export needs, as bytes.

The OpenTelemetry SDK and its OTLP exporter cost about 1.7 ms of CPU per traced request here
(attribute cleaning, span objects, then a protobuf object per attribute; measured with
``scripts/instructions --see``: 4.7 instructions per call where the floor takes 1), several times the
cost of relaying the call. A span is a flat message: this module writes its wire form directly
(``opentelemetry/proto/trace/v1/trace.proto``, ``common/v1/common.proto``), and an attribute that
does not change from request to request (a target's model, provider, address) is encoded once and
reused. The tests decode what it writes with ``opentelemetry-proto``, the schema's own classes.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Sequence

__all__ = ["CLIENT", "ERROR", "SERVER", "assemble", "attr", "export_request", "field", "known", "named", "scope",
           "seconds", "span", "status"]

SERVER, CLIENT = 2, 3  # Span.SpanKind
ERROR = 2  # Status.StatusCode
_LEN, _VARINT, _FIXED64 = 2, 0, 1

Value = str | bool | int | float | Sequence[str]


_SMALL = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


_STRING, _BOOL, _INT, _DOUBLE = _tag(1, _LEN), _tag(2, _VARINT), _tag(3, _VARINT), _tag(4, _FIXED64)
_KEY, _VALUE = _tag(1, _LEN), _tag(2, _LEN)


def _any(value: Value) -> bytes:
    """An AnyValue: string 1, bool 2, int 3, double 4, array 5."""
    if isinstance(value, str):
        data = value.encode("utf-8", "replace")
        return _STRING + _varint(len(data)) + data
    if isinstance(value, bool):
        return _BOOL + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _INT + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64, two's complement
    if isinstance(value, float):
        return _DOUBLE + struct.pack("<d", value)
    return field(5, b"".join([field(1, _any(v)) for v in value]))


@functools.lru_cache(maxsize=256)
def _key(key: str, field: int) -> tuple[bytes, bytes]:
    """The message field's tag and the encoded key: the same few dozen keys on every span."""
    return _tag(field, _LEN), _KEY + _varint(len(key)) + key.encode()


def attr(key: str, value: Value, field: int = 9) -> bytes:
    """One attribute as the field of its message (``Span.attributes`` is 9, ``Resource.attributes`` 1)."""
    tag, encoded_key = _key(key, field)
    value_bytes = _any(value)
    pair = encoded_key + _VALUE + _varint(len(value_bytes)) + value_bytes
    return tag + _varint(len(pair)) + pair


@functools.lru_cache(maxsize=4096, typed=True)  # True is not 1
def known(key: str, value: str | bool | int) -> bytes:
    """:func:`attr` for a value from a small set (a route, a status, an outcome word), encoded once."""
    return attr(key, value)


@functools.lru_cache(maxsize=256)
def _seconds_prefix(key: str) -> bytes:
    """Everything of a double attribute but its 8 bytes: its size does not depend on the value."""
    return attr(key, 0.0)[:-8]


def seconds(key: str, value: float) -> bytes:
    """A double attribute (a duration), the hot case: one cached prefix and the value."""
    return _seconds_prefix(key) + _PACK_D(value)


_PACK_D = struct.Struct("<d").pack


def field(number: int, data: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    return _tag(number, _LEN) + _varint(len(data)) + data


@functools.lru_cache(maxsize=1024)
def status(code: int, message: str) -> bytes:
    """``Span.status`` (field 15): its message (2) and code (3)."""
    return field(15, field(2, message.encode("utf-8", "replace")) + _tag(3, _VARINT) + _varint(code))


_IDS = struct.Struct(">2sQQ2sQ").pack  # trace_id (field 1: 16 bytes, two big-endian halves), span_id (2: 8 bytes)
_PARENT = struct.Struct(">2sQ").pack  # parent_span_id: field 4, 8 bytes
_TIMES = struct.Struct("<BQBQ").pack  # start_time_unix_nano (field 7), end_time_unix_nano (8): fixed64
_KINDS = {SERVER: _tag(6, _VARINT) + _varint(SERVER), CLIENT: _tag(6, _VARINT) + _varint(CLIENT)}


def named(name: str, kind: int) -> bytes:
    """A span's name (field 5) and kind (6): a route's or a target's, encoded once by the caller."""
    return field(5, name.encode("utf-8", "replace")) + _KINDS[kind]


def assemble(trace_hi: int, trace_lo: int, span_id: int, parent_id: int | None, trace_state: bytes,
             name_and_kind: bytes, start_ns: int, end_ns: int, attributes: bytes, status_field: bytes) -> bytes:
    """A ``Span`` message from its parts: the trace id as two 64-bit halves, ``trace_state`` as
    the encoded field 3 (or empty), ``attributes`` the concatenation of :func:`attr` results."""
    return b"".join((_IDS(b"\x0a\x10", trace_hi, trace_lo, b"\x12\x08", span_id), trace_state,
                     b"" if parent_id is None else _PARENT(b"\x22\x08", parent_id),
                     name_and_kind, _TIMES(0x39, start_ns, 0x41, end_ns), attributes, status_field))


def span(trace_id: bytes, span_id: int, parent_id: int | None, name: str, kind: int, start_ns: int, end_ns: int,
         attributes: bytes, status_of: tuple[int, str] | None = None, trace_state: str | None = None) -> bytes:
    """A ``Span`` message; ``trace_id`` is its 16 bytes. :func:`assemble` with every part spelled out."""
    hi, lo = divmod(int.from_bytes(trace_id, "big"), 1 << 64)
    return assemble(hi, lo, span_id, parent_id or None, field(3, trace_state.encode()) if trace_state else b"",
                    named(name, kind), start_ns, end_ns, attributes, status(*status_of) if status_of else b"")


def export_request(resource: bytes, scope: bytes, spans: Iterable[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` of one resource and one scope: ``resource`` holds the
    resource's attributes (field 1 each), ``scope`` is an encoded ``InstrumentationScope``, each
    of ``spans`` an encoded ``Span``. Written as one list joined once: a batch is 512 spans."""
    parts = [_tag(1, _LEN), b"", field(1, resource), _tag(2, _LEN), b"", field(1, scope)]
    size = len(parts[5])
    tag, varint = _SPAN_TAG, _varint
    for s in spans:
        head = varint(len(s))
        parts += (tag, head, s)
        size += 1 + len(head) + len(s)
    parts[4] = _varint(size)  # ScopeSpans (ResourceSpans field 2)
    parts[1] = _varint(len(parts[2]) + 1 + len(parts[4]) + size)  # ResourceSpans (request field 1)
    return b"".join(parts)


_SPAN_TAG = _tag(2, _LEN)  # ScopeSpans.spans


def scope(name: str, version: str) -> bytes:
    return field(1, name.encode()) + field(2, version.encode())
