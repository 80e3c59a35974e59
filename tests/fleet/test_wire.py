"""The fleet's wire form: fleet ids by what a target is, events in and out, nothing private."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.fleet.wire import MAX_BATCH_BYTES, MAX_EVENTS, decode, dumps, encode, fleet_ids

from ..conftest import make_config

FID = {("groq", "m"): "https://api.example/v1|m"}


def test_a_target_is_named_by_its_address_and_model_not_its_local_name() -> None:
    raw = {"providers": {"a": {"kind": "openai", "base_url": "https://api.example/v1"},
                         "b": {"kind": "openai", "base_url": "https://api.example/v1"},
                         "s": {"kind": "simulated"}},
           "routes": {"r": {"targets": [{"provider": "a", "model": "m"}, {"provider": "b", "model": "m"},
                                        {"provider": "s", "model": "m"}]}}}
    ids = fleet_ids(make_config(raw))
    assert ids[("a", "m")] == ids[("b", "m")] == "https://api.example/v1|m"
    assert ids[("s", "m")] == "simulated:s|m"


@pytest.mark.parametrize(("event", "wire"), [
    pytest.param(("s", ("groq", "m"), "streamed", 0.25), ["s", FID[("groq", "m")], "streamed", 0.25, 100.0],
                 id="sample-with-its-wall-time"),
    pytest.param(("c", ("groq", "m"), "buffered", 2.0), ["c", FID[("groq", "m")], "buffered", 2.0, 100.0],
                 id="censored-sample"),
    pytest.param(("f", ("groq", "m"), "503", 3, 30.0), ["f", FID[("groq", "m")], "503", 3, 30.0],
                 id="failure-with-its-threshold"),
    pytest.param(("o", ("groq", "m"), 50.0, 30.0), ["o", FID[("groq", "m")], 1050.0, 30.0],
                 id="opening-deadline-as-wall-clock"),
    pytest.param(("r", ("groq", "m"), 20.0), ["r", FID[("groq", "m")], 1020.0], id="retry-after-as-wall-clock"),
    pytest.param(("p", ("groq", "m")), None, id="probe-release-stays-local"),
    pytest.param(("s", ("other", "m"), "streamed", 0.1), None, id="unknown-target-left-out"),
])
def test_events_travel_with_wall_clock_times(event: tuple[Any, ...], wire: list[Any] | None) -> None:
    out = encode([(event, 100.0)], FID, lambda mono: mono + 1000.0)
    assert out == ([] if wire is None else [wire])
    assert decode(dumps(out)) == out


@pytest.mark.parametrize("payload", [
    pytest.param(b"not json", id="not-json"),
    pytest.param(b'{"a": 1}', id="not-a-list"),
    pytest.param(b'[["s", "x"], ["zz", "x", 1], 5]', id="wrong-arity-unknown-kind-not-a-list"),
])
def test_a_malformed_batch_is_dropped(payload: bytes) -> None:
    assert decode(payload) == []


F = ["f", "https://api.example/v1|m", "503", 3, 30.0]


@pytest.mark.parametrize(("event", "kept"), [
    pytest.param(F, F, id="a-failure-as-this-version-writes-it"),
    pytest.param([*F, 1700000000.5], F, id="a-failure-with-a-time-a-later-release-adds"),
    pytest.param([*F, 1700000000.5, {"more": 1}], F, id="two-fields-more"),
    pytest.param(["s", "x", "streamed", 0.25, 100.0, "extra"], ["s", "x", "streamed", 0.25, 100.0],
                 id="a-sample-with-a-field-more"),
    pytest.param(["n", {"x": 2}, 100.0, 7], ["n", {"x": 2}, 100.0], id="a-heartbeat-with-a-field-more"),
    pytest.param(F[:4], None, id="a-failure-short-of-a-field"),
    pytest.param(["zz", "x", 1, 2, 3, 4], None, id="a-kind-this-version-does-not-know"),
    pytest.param([5, "x", 1], None, id="a-kind-that-is-not-a-name"),
    pytest.param([], None, id="empty"),
])
def test_an_event_longer_than_this_version_knows_keeps_its_known_fields(event: list[Any],
                                                                         kept: list[Any] | None) -> None:
    """A rolling deploy: a later release may add a field at an event's end (a failure's time); peers of
    this version fold what they know of it, where they dropped the whole event (strict arity)."""
    assert decode(dumps([event, ["r", "x", 5.0]])) == ([] if kept is None else [kept]) + [["r", "x", 5.0]]


R = ["r", "https://api.example/v1|m", 5.0]


@pytest.mark.parametrize(("events", "kept"), [
    pytest.param([R] * MAX_EVENTS, MAX_EVENTS, id="a-peers-fullest-entry-whole"),
    pytest.param([R] * 20_000, MAX_EVENTS, id="more-events-than-a-peer-writes-cut"),
    pytest.param([R] * 300_000, 0, id="an-entry-past-the-byte-bound-dropped-unread"),
    pytest.param([["r", "x" * (MAX_BATCH_BYTES // 4), 5.0]] * 5, 0, id="more-bytes-than-a-peer-writes-dropped"),
])
def test_an_entry_is_bounded_as_a_peer_writes_one(events: list[Any], kept: int) -> None:
    """One entry is folded in one pass: one of 300,000 events (anything that can write the stream can
    write it) held every instance's loop for 3.6 s."""
    assert len(decode(dumps(events))) == kept
