"""SSE framing under hostile streams: an event with no end is bounded, and no read re-copies what is held.

Both framers firstbyte has (the taps' byte framer, the translators' line decoder) are fed an event in
many small reads. Before, each read re-joined or re-searched everything held, so 12 MiB in 2 KiB reads
moved tens of gigabytes; now that costs its length once, and past MAX_EVENT_BYTES the stream is too large.
"""

from __future__ import annotations

import time

import orjson
import pytest

from proxy.bounds import MAX_EVENT_BYTES
from proxy.errors import StreamTooLarge
from proxy.translate.anthropic_to_chat import AnthropicStreamToOpenAI
from proxy.translate.chat_to_messages import OpenAIStreamToAnthropic
from proxy.translate.sse import SseDecoder
from proxy.translate.usage_taps import AnthropicUsageTap, OpenAIUsageTap
from proxy.walk.classify import classify_exception

from ..python_calls import logprobs_chunk, python_calls

PIECE = b"x" * 2048


def event(text: str) -> bytes:
    payload = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


FEEDERS = {
    "openai-tap": lambda: OpenAIUsageTap(keep_usage_chunk=False).feed,
    "anthropic-tap": lambda: AnthropicUsageTap().feed,
    "sse-decoder": lambda: SseDecoder().feed,
    "anthropic-to-openai": lambda: AnthropicStreamToOpenAI("m", False).feed,
    "openai-to-anthropic": lambda: OpenAIStreamToAnthropic("m").feed,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(FEEDERS))
def test_an_event_held_over_many_reads_costs_its_length_once(name):
    feed = FEEDERS[name]()
    t0 = time.process_time()
    feed(b"data: ")
    for _ in range((12 * 2**20) // len(PIECE)):  # 12 MiB in 2 KiB reads, no end yet
        assert not feed(PIECE)
    took = time.process_time() - t0
    assert took < 1.0, f"{name}: {took:.2f} s of CPU for 12 MiB held (quadratic?)"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", list(FEEDERS))
def test_an_event_with_no_end_is_stream_too_large(name):
    feed = FEEDERS[name]()
    big = b"x" * 2**20
    with pytest.raises(StreamTooLarge) as caught:
        feed(b"data: ")
        for _ in range(MAX_EVENT_BYTES // len(big) + 2):
            feed(big)
    assert "stream too large" in str(caught.value)


@pytest.mark.parametrize("name", ["openai-tap", "anthropic-tap"])
def test_events_before_the_oversized_one_are_kept_as_partial(name):
    feed = FEEDERS[name]()
    with pytest.raises(StreamTooLarge) as caught:
        feed(event("a") + event("b") + b"data: " + b"x" * (MAX_EVENT_BYTES + 1))
    assert caught.value.partial == event("a") + event("b")


def test_a_ten_megabyte_event_still_passes():
    tap = OpenAIUsageTap(keep_usage_chunk=False)
    big = event("x" * 10 * 2**20)
    out = b"".join(tap.feed(big[i:i + 65536]) for i in range(0, len(big), 65536))
    assert out == big


@pytest.mark.parametrize("split", [1, 2, 3, 7, 64])
def test_a_boundary_split_across_reads_is_still_found(split):
    """The framer searches only new bytes plus the two held before them: \\n|\\n and \\n\\r|\\n."""
    stream = event("a") + b"data: {\"x\": 1}\r\n\r\n" + event("b") + b"data: [DONE]\n\n"
    tap = OpenAIUsageTap(keep_usage_chunk=True)
    out = b"".join(tap.feed(stream[i:i + split]) for i in range(0, len(stream), split))
    assert out == stream and tap.done


def test_stream_too_large_is_a_failover_safe_oversized_attempt():
    outcome = classify_exception(StreamTooLarge(MAX_EVENT_BYTES))
    assert outcome.word == "oversized" and outcome.failover and outcome.counts


def test_string_token_counts_are_read_not_added_as_strings():
    tap = OpenAIUsageTap(keep_usage_chunk=False)
    usage = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": "12", "completion_tokens": "four"}}
    tap.feed(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
    assert tap.usage == {"prompt_tokens": 12, "completion_tokens": 0, "total_tokens": 12}


_PACED_OK = [event("Hel"), event("lo"),
             b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
             b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n']


# A token-paced stream: every event its own read, the tap's shortcut for a read of one JSON data line.
@pytest.mark.parametrize(("reads", "out", "done", "finished"), [
    pytest.param([*_PACED_OK, b"data: [DONE]\n\n"], b"".join(_PACED_OK[:3]) + b"data: [DONE]\n\n", True, True,
                 id="usage-chunk-dropped-done"),
    pytest.param(_PACED_OK, b"".join(_PACED_OK[:3]), False, True, id="finished-without-done"),
    pytest.param([event("a"), b"data:[DONE]\n\n"], event("a") + b"data:[DONE]\n\n", True, False, id="done-no-space"),
    pytest.param([event("a"), b": sk-x\n\n", b"id: 9\n" + event("b")], event("a") + b":\n\n" + event("b"),
                 False, False, id="comment-and-id-out"),
    pytest.param([event("a"), b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"error"}]}\n\n'],
                 event("a") + b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"error"}]}\n\n',
                 False, False, id="finish-reason-error-is-no-finish"),
])
def test_a_paced_openai_stream_read_event_by_event(reads, out, done, finished):
    tap = OpenAIUsageTap(keep_usage_chunk=False)
    got = b"".join(tap.feed(read) for read in reads)
    assert (got, tap.done) == (out, done)
    assert tap.usage == ({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
                         if len(reads) >= 4 else None)
    if not done:  # the body ends without [DONE]: whole when a choice said its finish_reason
        tap.finish()
        assert tap.done == finished


@pytest.mark.parametrize(("read", "problem"), [
    pytest.param(b'data: {"choices":"oops"}\n\n', "choices is a string", id="choices-not-a-list"),
    pytest.param(b'data: {"choices":[{"index":0,"delta":{"content":5}}]}\n\n', "delta.content is a number",
                 id="content-not-a-string"),
    pytest.param(b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n', "overloaded",
                 id="error-envelope"),
])
def test_a_paced_openai_stream_ends_on_a_wrong_event_after_the_first_token(read, problem):
    tap = OpenAIUsageTap(keep_usage_chunk=False)
    assert tap.feed(event("a")) == event("a")
    with pytest.raises(Exception, match=problem) as caught:
        tap.feed(read)
    assert caught.value.partial == b""


@pytest.mark.parametrize(("reads", "out", "done"), [
    pytest.param([b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                  b'"delta":{"type":"text_delta","text":"a"}}\n\n',
                  b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":4}}\n\n',
                  b'event: message_stop\ndata: {"type":"message_stop"}\n\n'], None, True, id="usage-and-stop"),
    pytest.param([b"event: Odd-1\ndata: {}\n\n", b"id: 3\ndata: {}\n\n"], b"data: {}\n\ndata: {}\n\n", False,
                 id="odd-name-and-id-out"),
    pytest.param([b'event: X-Key-1\ndata: {"type":"ping"}\n\n', b'event: Y\ndata: {"type":"Sk-Key-2"}\n\n',
                  b'event: Z\r\nid: 1\r\ndata: {"type":"content_block_stop","index":0}\r\n\r\n'],
                 b'event: ping\ndata: {"type":"ping"}\n\ndata: {"type":"Sk-Key-2"}\n\n'
                 b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\r\n\r\n', False,
                 id="odd-name-named-by-a-plain-type-only"),
])
def test_a_paced_anthropic_stream_read_event_by_event(reads, out, done):
    tap = AnthropicUsageTap()
    got = b"".join(tap.feed(read) for read in reads)
    assert got == (b"".join(reads) if out is None else out)
    assert tap.done == done
    assert tap.usage == ({"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4} if done else None)


def test_a_paced_anthropic_text_not_a_string_ends_the_stream():
    tap = AnthropicUsageTap()
    with pytest.raises(Exception, match="text is not a string"):
        tap.feed(b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                 b'"delta":{"type":"text_delta","text":5}}\n\n')


_DEEP = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"x":' + b"[" * 700 + b"]" * 700 + b"}\n\n"
_LONG = event("y" * 5000)  # long, shallow: passes
_EVENTS = b"".join(event(f"w{i}") for i in range(300))


@pytest.mark.parametrize(("block", "before"), [
    pytest.param(_EVENTS + _DEEP + _EVENTS, len(_EVENTS), id="deep-in-the-middle-of-a-bulk-read"),
    pytest.param(_DEEP + _EVENTS, 0, id="deep-first"),
    pytest.param(_EVENTS + _DEEP, len(_EVENTS), id="deep-last"),
    pytest.param((_EVENTS + _DEEP + _EVENTS).replace(b"\n\n", b"\r\n\r\n"), len(_EVENTS) + 600, id="crlf-framed"),
    pytest.param(_EVENTS + _LONG + _EVENTS, None, id="long-but-shallow-passes"),
    pytest.param(_EVENTS + _EVENTS, None, id="ordinary-bulk-read-passes"),
])
def test_a_bulk_read_with_an_event_nested_too_deep_ends_at_that_event(block: bytes, before: int | None) -> None:
    """The depth check clears a read by looking for a blank line at least every DEEP_BYTES: an event
    nested past 512 levels is found wherever it sits in the read, whatever its framing."""
    tap = OpenAIUsageTap(keep_usage_chunk=True)
    if before is None:
        assert tap.feed(block) == block
        return
    with pytest.raises(Exception, match="nests its JSON more than 512 levels deep") as caught:
        tap.feed(block)
    assert len(caught.value.partial) == before


def test_a_long_bushy_event_is_judged_for_depth_from_its_bytes_not_by_a_walk() -> None:
    """The depth check parsed such an event and walked its containers in Python (a 0.8 MB answer: 85 ms);
    its depth is read from its bytes now, so the Python work does not grow with the containers."""
    block = event("first") + logprobs_chunk(1000) + event("last")
    assert block.count(b"[") + block.count(b"{") > 10_000
    tap = OpenAIUsageTap(keep_usage_chunk=True)
    calls = python_calls(lambda: tap.feed(block))
    assert calls < 100, calls
    assert OpenAIUsageTap(keep_usage_chunk=True).feed(block) == block
