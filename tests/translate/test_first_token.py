"""The first token commits (docs/adr/0007): the gates as tables, and the classification of
errors an upstream sends inside a 2xx."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import StreamTooLarge
from proxy.translate.first_token import (
    COMMITTED,
    MAX_OPENING,
    AnthropicFirstToken,
    Ended,
    FirstToken,
    OpenAIFirstToken,
    ResponsesFirstToken,
    UpstreamError,
    error_in_body,
)
from proxy.walk.classify import classify_ended, classify_error

from ..python_calls import logprobs_chunk, python_calls


def data(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def delta(**fields: object) -> bytes:
    return data({"choices": [{"index": 0, "delta": fields, "finish_reason": None}]})


def event(kind: str, **payload: object) -> bytes:
    return b"event: " + kind.encode() + b"\n" + data({"type": kind, **payload})


ROLE = delta(role="assistant", content="")
DEEP_BEHIND = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"x":' + b"[" * 5000 + b"]" * 5000
               + b"}]}\n\n")
TEXT = delta(content="Hi")
MESSAGE_START = event("message_start", message={"id": "msg_1", "usage": {"input_tokens": 3}})
EMPTY_TEXT_START = event("content_block_start", index=0, content_block={"type": "text", "text": ""})
PING = event("ping")
TEXT_DELTA = event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})


def verdicts(gate: FirstToken, reads: list[bytes]) -> list[object]:
    """Per read: None while undecided, then COMMITTED or the failure's type."""
    out: list[object] = []
    for read in reads:
        if not gate.feed(read):
            out.append(None)
            continue
        out.append(COMMITTED if gate.failure is None else type(gate.failure).__name__)
        break
    return out


@pytest.mark.parametrize(
    ("reads", "want"),
    [
        pytest.param([TEXT], [COMMITTED], id="content-in-the-first-read"),
        pytest.param([ROLE, TEXT], [None, COMMITTED], id="role-only-delta-is-held"),
        pytest.param([b": keep-alive\n\n", b": OPENROUTER PROCESSING\n\n", TEXT], [None, None, COMMITTED],
                     id="comments-are-held"),
        pytest.param([ROLE[:10], ROLE[10:] + TEXT[:7], TEXT[7:]], [None, None, COMMITTED],
                     id="events-cut-anywhere-by-reads"),
        pytest.param([ROLE.replace(b"\n\n", b"\r\n\r\n"), TEXT.replace(b"\n\n", b"\r\n\r\n")], [None, COMMITTED],
                     id="crlf-framing"),
        pytest.param([delta(tool_calls=[{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}])],
                     [COMMITTED], id="tool-call-delta-commits"),
        pytest.param([delta(refusal="no")], [COMMITTED], id="refusal-commits"),
        pytest.param([delta(reasoning_content="thinking")], [COMMITTED], id="reasoning-commits"),
        pytest.param([data({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})], [COMMITTED],
                     id="a-finish-commits-an-empty-answer"),
        pytest.param([data({"choices": [{"index": 0, "text": "Hi", "finish_reason": None}]})], [COMMITTED],
                     id="legacy-completion-text-commits"),
        pytest.param([data({"choices": [], "usage": {"prompt_tokens": 1}})], [None], id="usage-only-is-held"),
        pytest.param([ROLE, data({"error": {"message": "busy", "type": "server_error", "code": "overloaded"}})],
                     [None, "UpstreamError"], id="error-envelope-after-role"),
        pytest.param([data({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "error"}],
                            "error": {"code": 502, "message": "provider down"}})],
                     ["UpstreamError"], id="openrouter-error-with-content-is-an-error"),
        pytest.param([b'data: {"choices": [{"delta": {"content": "spaced"}}]}\n\n'], [COMMITTED],
                     id="spaced-json-is-parsed"),
        pytest.param([data({"object": "error", "message": "bad", "type": "BadRequestError", "code": 400})],
                     ["UpstreamError"], id="vllm-error-object"),
        pytest.param([ROLE, b"data: [DONE]\n\n"], [None, "Ended"], id="done-before-content"),
        pytest.param([b"data: {not json\n\n"], ["Ended"], id="malformed-before-content"),
        # Content, then nesting no parser reads (the client's raised RecursionError): never committed unparsed,
        # whole in one read or cut before its end (the lean path once took the first part for an event)
        pytest.param([DEEP_BEHIND], ["Ended"], id="nested-past-a-parser-behind-the-content"),
        pytest.param([DEEP_BEHIND[:120], DEEP_BEHIND[120:]], [None, "Ended"],
                     id="nested-past-a-parser-behind-the-content-cut-by-reads"),
    ],
)
def test_openai_gate(reads: list[bytes], want: list[object]) -> None:
    assert verdicts(OpenAIFirstToken(), reads) == want


@pytest.mark.parametrize(
    ("reads", "want"),
    [
        pytest.param([MESSAGE_START + EMPTY_TEXT_START + PING + TEXT_DELTA], [COMMITTED], id="one-read"),
        pytest.param([MESSAGE_START, EMPTY_TEXT_START, PING, TEXT_DELTA], [None, None, None, COMMITTED],
                     id="message-start-block-start-ping-are-held"),
        pytest.param([MESSAGE_START, event("content_block_start", index=0,
                                           content_block={"type": "tool_use", "id": "t", "name": "f"})],
                     [None, COMMITTED], id="tool-use-start-commits"),
        pytest.param([MESSAGE_START, event("content_block_delta", index=0,
                                           delta={"type": "thinking_delta", "thinking": "hm"})],
                     [None, COMMITTED], id="thinking-commits"),
        pytest.param([MESSAGE_START, event("content_block_delta", index=0, delta={"type": "text_delta", "text": ""})],
                     [None, None], id="empty-text-delta-is-held"),
        pytest.param([MESSAGE_START, event("message_delta", delta={"stop_reason": "end_turn"})],
                     [None, COMMITTED], id="a-stop-reason-commits-an-empty-answer"),
        pytest.param([MESSAGE_START, event("error", error={"type": "overloaded_error", "message": "Overloaded"})],
                     [None, "UpstreamError"], id="error-after-message-start"),
    ],
)
def test_anthropic_gate(reads: list[bytes], want: list[object]) -> None:
    assert verdicts(AnthropicFirstToken(), reads) == want


def test_held_events_leave_with_the_first_content_in_order() -> None:
    gate = OpenAIFirstToken()
    assert not gate.feed(b": hi\n\n" + ROLE)
    assert not gate.feed(TEXT[:5])
    assert gate.feed(TEXT[5:] + delta(content="more")) and gate.failure is None
    assert gate.held == b": hi\n\n" + ROLE + TEXT + delta(content="more")


def test_an_opening_past_the_bound_commits_as_it_is_instead_of_growing() -> None:
    gate = OpenAIFirstToken()
    keepalive = b": " + b"x" * 1000 + b"\n\n"
    fed = 0
    while not gate.feed(keepalive):
        fed += len(keepalive)
    fed += len(keepalive)
    assert gate.failure is None and MAX_OPENING < fed <= MAX_OPENING + len(keepalive)


def test_a_large_first_event_that_begins_as_content_goes_on_past_the_bound() -> None:
    gate = OpenAIFirstToken()
    start = b'data: {"choices": [{"delta": {"content": "' + b"x" * (MAX_OPENING // 2)
    assert not gate.feed(start)  # its end may still bring content
    assert gate.feed(b"x" * MAX_OPENING) and gate.failure is None  # past the bound: on as it is
    assert len(gate.held) == len(start) + MAX_OPENING


def test_a_large_event_with_no_end_before_any_content_is_oversized() -> None:
    gate = OpenAIFirstToken()
    assert not gate.feed(ROLE + b"data: " + b"x" * (MAX_OPENING // 2))
    with pytest.raises(StreamTooLarge):  # a failover before commit; nothing held past the bound
        gate.feed(b"x" * MAX_OPENING)


def test_a_drip_fed_event_is_searched_once() -> None:
    """One byte per read: the pending event grows in place (no copy of it per read)."""
    gate = OpenAIFirstToken()
    stream = ROLE + TEXT
    for i, byte in enumerate(stream):
        decided = gate.feed(bytes([byte]))
        assert decided == (i == len(stream) - 1), i
    assert gate.failure is None and gate.held == stream


@pytest.mark.parametrize(
    ("error", "where", "overflow", "want"),
    [
        pytest.param(UpstreamError(None, "overloaded_error", "Overloaded", b""), "event", False,
                     ("error event overloaded_error", True, 529), id="anthropic-overloaded"),
        pytest.param(UpstreamError(None, "rate_limit_exceeded", "slow down", b""), "event", False,
                     ("error event rate_limit_exceeded", True, 429), id="rate-limit"),
        pytest.param(UpstreamError(None, "server_error", "boom", b""), "body", False,
                     ("error body server_error", True, 500), id="buffered-server-error"),
        pytest.param(UpstreamError(None, "invalid_request_error", "bad temperature", b""), "event", False,
                     ("error event invalid_request_error", False, 400), id="invalid-request-is-returned"),
        pytest.param(UpstreamError(None, "invalid_request_error", "maximum context length", b""), "event", True,
                     ("error event invalid_request_error", True, 400), id="context-overflow-fails-over"),
        pytest.param(UpstreamError(502, "unknown", "provider down", b""), "event", False,
                     ("error event unknown", True, 502), id="numeric-code-is-the-twin"),
        pytest.param(UpstreamError(None, "Something; served=evil", "x", b""), "event", False,
                     ("error event something__served_evil", True, 502), id="unknown-kind-is-scrubbed"),
    ],
)
def test_classify_error(error: UpstreamError, where: str, overflow: bool, want: tuple[str, bool, int]) -> None:
    outcome = classify_error(error, where, overflow)
    assert (outcome.word, outcome.failover, outcome.status) == want
    assert outcome.counts


def test_a_stream_that_ends_before_content_is_failover_safe() -> None:
    outcome = classify_ended(Ended("empty stream", "nothing"))
    assert (outcome.word, outcome.failover, outcome.status, outcome.counts) == ("empty stream", True, 502, True)


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        pytest.param(b'{"error": {"message": "busy", "type": "server_error"}}', "server_error", id="openai"),
        pytest.param(b'{"type": "error", "error": {"type": "overloaded_error", "message": "O"}}',
                     "overloaded_error", id="anthropic"),
        pytest.param(b'{"choices": [{"message": {"content": "the word \\"error\\""}, "finish_reason": "stop"}]}',
                     None, id="an-answer-that-mentions-error"),
        pytest.param(b'{"choices": [{"finish_reason": "error"}]}', None, id="an-answer-with-error-as-a-value"),
        pytest.param(b"not json", None, id="not-json-is-not-an-error-object"),
    ],
)
def test_error_in_body(body: bytes, kind: str | None) -> None:
    found = error_in_body(body)
    assert (None if found is None else found.kind) == kind


def responses_event(kind: str, **payload: object) -> bytes:
    return b"event: " + kind.encode() + b"\n" + data({"type": kind, **payload})


@pytest.mark.parametrize(
    ("reads", "want"),
    [
        pytest.param([responses_event("response.created", response={"id": "r"}),
                      responses_event("response.in_progress", response={"id": "r"}),
                      responses_event("response.output_item.added", item={"type": "message", "content": []}),
                      responses_event("response.content_part.added", part={"type": "output_text", "text": ""}),
                      responses_event("response.output_text.delta", delta="Hi")],
                     [None, None, None, None, COMMITTED], id="text-delta-commits"),
        pytest.param([responses_event("response.output_item.added", item={"type": "function_call", "name": "f"})],
                     [COMMITTED], id="a-function-call-item-commits"),
        pytest.param([responses_event("response.created", response={"id": "r"}),
                      responses_event("response.failed", response={"error": {"code": "server_error",
                                                                             "message": "boom"}})],
                     [None, "UpstreamError"], id="response-failed-is-an-error"),
        pytest.param([responses_event("error", code="rate_limit_exceeded", message="slow down")],
                     ["UpstreamError"], id="error-event"),
    ],
)
def test_responses_gate(reads: list[bytes], want: list[object]) -> None:
    assert verdicts(ResponsesFirstToken(), reads) == want


def test_a_long_bushy_first_event_is_judged_for_depth_from_its_bytes_not_by_a_walk() -> None:
    """As the taps' check (test_usage_taps.py): the gate walked a long first event's parsed containers for
    its depth; a logprobs chunk of a thousand tokens made 26,000 Python calls, its bytes a handful."""
    for first in (logprobs_chunk(1000), delta(role="assistant") + logprobs_chunk(1000)):
        gate = OpenAIFirstToken()
        calls = python_calls(lambda: gate.feed(first))  # noqa: B023 (called at once)
        assert gate.held and gate.failure is None
        assert calls < 150, calls


def _crs(*events: bytes) -> bytes:
    """``events`` with every line ended by a lone CR, as the WHATWG SSE spec lets a stream end them."""
    return b"".join(events).replace(b"\n", b"\r")


@pytest.mark.parametrize(("gate", "opening", "held"), [
    pytest.param(OpenAIFirstToken, _crs(ROLE, TEXT), ROLE + TEXT, id="openai-crs-only"),
    pytest.param(OpenAIFirstToken, ROLE.replace(b"\n\n", b"\r\n\r\n") + _crs(TEXT),
                 ROLE.replace(b"\n\n", b"\r\n\r\n") + TEXT, id="openai-crlf-then-crs"),
    pytest.param(OpenAIFirstToken, _crs(ROLE, TEXT) + b"\n", ROLE + TEXT[:-1] + b"\r\n",
                 id="openai-crs-then-a-crlf-kept"),
    pytest.param(AnthropicFirstToken, _crs(MESSAGE_START, EMPTY_TEXT_START, TEXT_DELTA),
                 MESSAGE_START + EMPTY_TEXT_START + TEXT_DELTA, id="anthropic-crs-only"),
])
def test_an_opening_framed_by_lone_crs_commits_at_its_first_token(gate: type[FirstToken], opening: bytes,
                                                                  held: bytes) -> None:
    """An SSE client ends a line at CRLF, LF or a lone CR: cut anywhere into two reads, an opening framed by
    CRs commits at its first token, handing on the events as LF-framed (the framer after it does the same).
    It found no event before, and the stream failed as empty when it ended."""
    for cut in range(len(opening) + 1):
        one = gate()
        reads = [part for part in (opening[:cut], opening[cut:]) if part]
        if verdicts(one, reads)[-1] is None:  # its last CR may begin a CRLF: the next read, or the end, says
            assert one.end() and one.failure is None, cut
        assert one.held == held, (cut, one.held)
