"""translate/sse.py: the one SSE framing every gate, tap and translator reads through."""

from __future__ import annotations

import re

import orjson
import pytest

from proxy.bounds import MAX_EVENT_BYTES
from proxy.errors import StreamTooLarge
from proxy.translate.anthropic_to_chat import AnthropicStreamToOpenAI
from proxy.translate.first_token import AnthropicFirstToken, OpenAIFirstToken
from proxy.translate.passthrough import answer_lines
from proxy.translate.sse import (
    BOM,
    EventFramer,
    Opening,
    SseDecoder,
    data_of,
    event_around,
    fields,
    last_event_end,
    opening_events,
    split_events,
    without_bom,
)
from proxy.translate.usage_taps import OpenAIUsageTap


@pytest.mark.parametrize(
    ("event", "name", "data"),
    [
        pytest.param(b"data: x\n\n", None, b"x", id="one-space-dropped"),
        pytest.param(b"data:x\n\n", None, b"x", id="no-space"),
        pytest.param(b"data:  x\n\n", None, b" x", id="only-one-space-dropped"),
        pytest.param(b"event: ping\ndata: {}\n\n", "ping", b"{}", id="named"),
        pytest.param(b"data: a\r\ndata: b\r\n\r\n", None, b"a\nb", id="crlf-lines-joined"),
        pytest.param(b": keep-alive\n\n", None, None, id="comment-has-no-data"),
        pytest.param(b"event: x\n\n", "x", None, id="name-without-data"),
        pytest.param(b"data\n\n", None, b"", id="field-without-colon"),
        pytest.param(b"datum: x\n\n", None, None, id="another-field-is-not-data"),
    ],
)
def test_an_events_fields_follow_the_sse_rule(event: bytes, name: str | None, data: bytes | None) -> None:
    """first_token stripped every space after ``data:``, usage_taps every whitespace, the decoder one:
    one rule now, the spec's (one optional space)."""
    assert fields(event) == (name, data)
    assert data_of(event) == (data or b"")


@pytest.mark.parametrize(
    ("block", "events"),
    [
        pytest.param(b"data: 1\n\ndata: 2\n\n", [b"data: 1\n\n", b"data: 2\n\n"], id="lf"),
        pytest.param(b"data: 1\r\n\r\ndata: 2\n\n", [b"data: 1\r\n\r\n", b"data: 2\n\n"], id="crlf-then-lf"),
        pytest.param(b"data: 1\n\ndata: 2", [b"data: 1\n\n", b"data: 2"], id="unfinished-last"),
    ],
)
def test_a_block_splits_into_events_that_rejoin_unchanged(block: bytes, events: list[bytes]) -> None:
    assert split_events(block) == events
    assert b"".join(events) == block


def test_the_event_around_a_position_is_found_and_the_last_boundary_is_where_the_block_ends() -> None:
    block = b"data: 1\n\ndata: {\"usage\": {}}\r\n\r\ndata: 3\n\n"
    start, end = event_around(block, block.index(b"usage"))
    assert block[start:end] == b"data: {\"usage\": {}}\r\n\r\n"
    assert last_event_end(block) == len(block)
    assert last_event_end(b"data: 1") == -1


@pytest.mark.parametrize("size", [pytest.param(1, id="byte-by-byte"), pytest.param(7, id="seven-bytes")])
def test_events_are_whole_whatever_the_read_boundaries(size: int) -> None:
    stream = b"event: a\ndata: {\"x\": 1}\n\n: ping\n\ndata: \xc3\xa9\r\n\r\n"
    framer, decoder = EventFramer(), SseDecoder()
    framed, decoded = b"", []
    for i in range(0, len(stream), size):
        framed += framer.complete(stream[i:i + size])
        decoded += decoder.feed(stream[i:i + size])
    assert framed == stream
    assert decoded == [("a", b'{"x": 1}'), (None, "é".encode())]


def test_an_event_without_end_is_cut_at_the_bound_after_the_complete_ones() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: 1\n\ndata: " + b"x" * (MAX_EVENT_BYTES + 1)) == [(None, b"1")]
    with pytest.raises(StreamTooLarge):
        decoder.feed(b"more")


ANTHROPIC_OPENING = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":3}}}\n\n'
    b'event: ping\ndata: {"type":"ping"}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"Hi"}}\n\n'
)


def test_the_gate_hands_on_the_events_it_decoded_with_the_opening() -> None:
    gate = AnthropicFirstToken()
    assert gate.feed(ANTHROPIC_OPENING + b'event: content_block_delta\ndata: {"type":"content_block_')
    held = gate.held
    assert type(held) is Opening
    events, rest = opening_events(held)
    assert [e["type"] for _, e in events] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert rest == b'event: content_block_delta\ndata: {"type":"content_block_'


def test_a_translator_does_not_decode_the_opening_again() -> None:
    """What the gate decoded reaches the translator as objects: its bytes are not parsed a second time
    (shown with an opening whose bytes would not parse)."""
    events = [(name, orjson.loads(data_of(e))) for e in split_events(ANTHROPIC_OPENING)
              for name in [fields(e)[0]]]
    garbled = b"x" * len(ANTHROPIC_OPENING)
    opening = Opening(garbled + b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                                b'"delta":{"type":"text_delta","text":" there"}}\n\n')
    opening.events, opening.decoded = events, len(garbled)
    out = AnthropicStreamToOpenAI("m", include_usage=False).feed(opening)
    texts = [orjson.loads(data_of(e))["choices"][0]["delta"].get("content") for e in split_events(out)]
    assert texts == ["", "Hi", " there"]


def test_a_first_read_that_is_all_content_is_held_as_it_is() -> None:
    """The common OpenAI case is decided without decoding: nothing to hand on, plain bytes."""
    gate = OpenAIFirstToken()
    first = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    assert gate.feed(first)
    assert type(gate.held) is bytes and gate.held == first


@pytest.mark.parametrize(("block", "kept"), [
    pytest.param(b"data: x\n\n", b"data: x\n\n", id="data-as-it-is"),
    pytest.param(b"event: e\ndata: x\n\n", b"event: e\ndata: x\n\n", id="named-event-as-it-is"),
    pytest.param(b"data: a\ndata: b\n\n", b"data: a\ndata: b\n\n", id="two-data-lines"),
    pytest.param(b"data: x\r\n\r\n", b"data: x\r\n\r\n", id="crlf-as-it-is"),
    pytest.param(b": sk-secret\n\ndata: x\n\n", b":\n\ndata: x\n\n", id="comment-text-cut-keep-alive-kept"),
    pytest.param(b"id: sk-secret\ndata: x\n\n", b"data: x\n\n", id="id-line-dropped"),
    pytest.param(b"data: x\n: sk-secret\nretry: 5\n\n", b"data: x\n\n", id="comment-inside-an-event-dropped"),
    pytest.param(b"id: 1\n\n", b"", id="event-of-nothing-but-an-id-dropped"),
    pytest.param(b"data: x\r\n\r\n: c\r\n\r\n", b"data: x\r\n\r\n:\n\n", id="crlf-comment"),
    pytest.param(b"data: x\n\n: sk-cut", b"data: x\n\n:\n\n", id="unended-comment-at-the-end"),
    pytest.param(b"datax: sk\ndata: x\n\n", b"data: x\n\n", id="unknown-field-dropped"),
    pytest.param(b"event: sk-Live-0123\ndata: x\n\n", b"data: x\n\n", id="event-name-no-api-uses-dropped"),
    pytest.param(b"data: x\n\nevent: Key_9\r\ndata: y\r\n\r\n", b"data: x\n\ndata: y\r\n\r\n",
                 id="a-later-odd-event-name-dropped"),
    pytest.param(b"event: response.output_text.delta\r\ndata: x\r\n\r\n",
                 b"event: response.output_text.delta\r\ndata: x\r\n\r\n", id="responses-name-kept"),
    pytest.param(b"", b"", id="empty"),
])
def test_a_passthrough_block_keeps_only_its_answer_lines(block, kept):
    assert answer_lines(block) == kept


# Each a read of its own, as a token-paced stream sends them: the one-event shortcut (no regex)
# must keep exactly what the full look keeps. Each is looked at twice (an event line's verdict is
# remembered the first time).
@pytest.mark.parametrize(("block", "kept"), [
    pytest.param(b'data: {"a":1}\n\n', b'data: {"a":1}\n\n', id="one-data-line"),
    pytest.param(b"event: content_block_delta\ndata: {}\n\n", b"event: content_block_delta\ndata: {}\n\n",
                 id="plain-name-and-data"),
    pytest.param(b"event:ping\r\ndata: {}\n\n", b"event:ping\r\ndata: {}\n\n", id="plain-name-crlf-no-space"),
    pytest.param(b"event: Odd-9\ndata: {}\n\n", b"data: {}\n\n", id="odd-name-dropped"),
    pytest.param(b"id: 7\ndata: {}\n\n", b"data: {}\n\n", id="id-then-data"),
    pytest.param(b"retry: 5\ndata: {}\n\n", b"data: {}\n\n", id="retry-then-data"),
    pytest.param(b"event: e\nid: 1\n\n", b"event: e\n\n", id="name-then-id"),
    pytest.param(b"data: {}\nX", b"data: {}", id="data-then-unended-line"),
    pytest.param(b"data: {}\nX\n", b"data: {}\n", id="data-then-a-line-no-blank"),
    pytest.param(b": sk-x\n\n", b":\n\n", id="comment-only"),
    pytest.param(b"\ndata: {}\n\n", b"\ndata: {}\n\n", id="blank-first-line"),
    pytest.param(b"\n", b"", id="one-newline"),
    pytest.param(b"event: e\ndata: {}\n\r\n", b"event: e\ndata: {}\n\r\n", id="name-data-crlf-blank"),
    pytest.param(b"event: e\ndata: {}\nid: 2\n\n", b"event: e\ndata: {}\n\n", id="name-data-id"),
    pytest.param(b"datum: x\n\n", b"", id="a-field-no-api-has"),
])
def test_a_read_of_one_event_keeps_what_the_full_look_keeps(block, kept):
    assert answer_lines(block) == kept
    assert answer_lines(block) == kept



def _spec_lines(stream: bytes) -> bytes:
    """``stream`` as an SSE client reads its lines (CRLF, LF or a lone CR ends one), each ended by LF."""
    return re.sub(rb"\r\n|\r", b"\n", stream)


@pytest.mark.parametrize("stream", [
    pytest.param(b"data: x\r: k\rid: k\r\rdata: y\n\n", id="lone-crs-then-lf"),
    pytest.param(b"data: x\r\n\r\ndata: y\r\rdata: z\n\n", id="crlf-then-lone-crs"),
    pytest.param(b"data: x\r\rdata: y\r\n\r\n", id="lone-cr-blank-line"),
    pytest.param(b"data: x\n\r\ndata: y\r\n\n", id="lf-then-crlf-blank-lines"),
    pytest.param(b"data: x\r\r\ndata: y\r\r\n", id="cr-then-crlf"),
    pytest.param(b": k\r\rdata: x\n\n", id="a-lone-cr-comment-first"),
])
def test_the_framer_ends_lines_where_an_sse_client_does(stream: bytes) -> None:
    """Cut anywhere into two reads: a lone CR ends a line as an LF does, a CRLF split between reads is one
    line end, and what the framer hands on is the lines and events a client reads (a CRLF kept as it is)."""
    events = [data for _, data in SseDecoder().feed(_spec_lines(stream))]
    assert events and all(b"k" not in data for data in events)
    for cut in range(len(stream) + 1):
        framer = EventFramer()
        out = framer.complete(stream[:cut]) + framer.complete(stream[cut:]) + framer.rest()
        assert b"\r" not in out.replace(b"\r\n", b""), (cut, out)
        assert _spec_lines(out) == _spec_lines(stream), (cut, out)
        decoder = SseDecoder()
        assert [data for _, data in decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])] == events, cut


# A stream that begins with UTF-8's byte-order mark (WHATWG SSE: one leading BOM is ignored). Its first event
# was lost: ``\xef\xbb\xbfdata: ...`` is no data line, so the gate held it as a comment and answer_lines dropped it.
_OPENING = (b'data: {"choices":[{"index":0,"delta":{"content":"first"}}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":" second"}}]}\n\ndata: [DONE]\n\n')


def _cuts(stream: bytes) -> list[list[bytes]]:
    """``stream`` in reads cut at every one and every two places within its first 12 bytes, and at every
    single place after them: a BOM's three bytes arrive in one read, two, or three."""
    reach = min(12, len(stream))
    single = [[stream[:k], stream[k:]] for k in range(1, len(stream))]
    double = [[stream[:i], stream[i:j], stream[j:]] for i in range(1, reach) for j in range(i + 1, reach)]
    return single + double


def _relayed(reads: list[bytes]) -> bytes:
    """What a client gets of ``reads``: the first-token gate until it commits, the usage tap after it."""
    gate, tap = OpenAIFirstToken(), OpenAIUsageTap(keep_usage_chunk=False)
    reads = list(reads)
    while reads:
        if gate.feed(reads.pop(0)):
            break
    else:
        assert gate.end()
    assert gate.failure is None, gate.failure
    return tap.feed(gate.held) + b"".join(tap.feed(read) for read in reads) + tap.finish()


@pytest.mark.parametrize(("stream", "relayed"), [
    pytest.param(BOM + _OPENING, _OPENING, id="one-bom-is-dropped"),
    pytest.param(_OPENING, _OPENING, id="no-bom"),
    pytest.param(BOM + b": hi\n\n" + _OPENING, b":\n\n" + _OPENING, id="a-bom-before-a-comment"),
])
def test_a_bom_at_the_streams_start_is_dropped_at_every_cut(stream: bytes, relayed: bytes) -> None:
    for reads in _cuts(stream):
        assert _relayed(reads) == relayed, reads[:2]


@pytest.mark.parametrize(("head", "data", "out", "left"), [
    pytest.param(b"", BOM + b"data: x", b"data: x", None, id="whole"),
    pytest.param(b"", BOM[:1], b"", BOM[:1], id="first-byte-waits"),
    pytest.param(BOM[:1], BOM[1:2], b"", BOM[:2], id="second-byte-waits"),
    pytest.param(BOM[:2], BOM[2:] + b"data: x", b"data: x", None, id="third-byte-decides"),
    pytest.param(BOM[:2], b"data: x", BOM[:2] + b"data: x", None, id="not-a-bom-after-all-keeps-its-bytes"),
    pytest.param(b"", BOM + BOM + b"data: x", BOM + b"data: x", None, id="only-one-bom"),
    pytest.param(b"", b"data: x" + BOM, b"data: x" + BOM, None, id="not-at-the-start"),
    pytest.param(b"", b"\xef\xbf\xbd", b"\xef\xbf\xbd", None, id="another-character-of-the-same-first-byte"),
])
def test_without_bom_decides_from_the_streams_first_bytes(head: bytes, data: bytes, out: bytes,
                                                           left: bytes | None) -> None:
    assert without_bom(head, data) == (out, left)


@pytest.mark.parametrize("stream", [
    pytest.param(BOM[:1], id="one-byte-of-a-bom"),
    pytest.param(BOM[:2], id="two-bytes-of-a-bom"),
    pytest.param(BOM, id="a-bom-alone"),
])
def test_a_stream_that_ends_in_its_bom_is_empty(stream: bytes) -> None:
    gate = OpenAIFirstToken()
    assert not gate.feed(stream) and gate.end()
    assert gate.failure is not None and gate.failure.why == "empty stream"
