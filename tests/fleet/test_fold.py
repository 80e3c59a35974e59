"""A peer's events folded into the local state: through State's heard_* methods, never told back."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.fleet.fold import Peers, fold, split
from proxy.state import State

KEYS = {"u|m": [("a", "m"), ("b", "m")]}  # one upstream, two local names


def folded(*wires: list[Any], now: float = 100.0) -> tuple[State, list[Any], int]:
    state, told = State(), []
    state.listener = told.append
    applied = fold(state, "peer", list(wires), KEYS, now, lambda wall: wall - 1000.0, Peers())
    return state, told, applied


def test_a_sample_reaches_every_local_name_of_the_upstream_and_is_not_told_back() -> None:
    state, told, applied = folded(["s", "u|m", "streamed", 0.2, 1099.0])
    assert applied == 2 and told == []
    assert state.tracker.samples(("a", "m")) == state.tracker.samples(("b", "m")) == 1
    assert state.tracker.age(("a", "m"), 100.0) == 1.0  # taken at the peer's wall time, on our clock


def test_a_sample_from_a_clock_ahead_lands_now() -> None:
    state, _, _ = folded(["s", "u|m", "streamed", 0.2, 1200.0])
    assert state.tracker.age(("a", "m"), 100.0) == 0.0


def test_failures_count_together_and_open_at_the_threshold() -> None:
    state, _, _ = folded(*[["f", "u|m", "503", 3, 30.0]] * 3)
    health = state.health(("a", "m"), 100.0)
    assert health.state == "open" and health.seconds_left == 30.0


def test_an_opening_and_a_cooldown_arrive_as_deadlines() -> None:
    state, _, _ = folded(["o", "u|m", 1130.0, 30.0], ["r", "u|m", 1110.0])
    assert state.health(("a", "m"), 100.0).seconds_left == 30.0
    assert state.health(("b", "m"), 100.0).cooling == 10.0


def test_an_opening_is_stamped_when_it_opened_not_when_it_was_heard() -> None:
    """Explain's "breaker opened by X at T": T was the fold's own clock, so a loaded box's late read
    moved it after the call that opened it (a full run read it 15 ms late)."""
    state, _, _ = folded(["o", "u|m", 1129.0, 30.0], now=100.0)  # opened at 1099 on the peer's wall clock
    assert state.targets[("a", "m")].breaker_by == ("peer", "opened", 99.0)


def test_a_failure_that_opens_here_takes_the_openers_time_from_its_opening() -> None:
    """A peer's failure at the threshold opens the breaker here as it is heard; the opening that comes
    with it says when it opened there (the full suite read explain's time 14 ms after the call)."""
    state, _, _ = folded(["f", "u|m", "503", 1, 30.0], ["o", "u|m", 1129.0, 30.0], now=100.0)
    assert state.targets[("a", "m")].breaker_by == ("peer", "opened", 99.0)


def test_a_malformed_event_is_skipped_alone() -> None:
    state, _, applied = folded(["s", "u|m", "no-such-mode", 0.2, 1099.0], ["r", "u|m", 1110.0])
    assert applied == 2  # the cooldown, on both names
    assert state.tracker.samples(("a", "m")) == 0


def test_peers_loads_expire() -> None:
    peers = Peers()
    peers.heard("p1", {"u|m": 2}, 0.0)
    assert peers.in_flight("u|m", 1.0) == 2 and peers.in_flight("u|m", 3.0) == 0


def test_a_peers_deadlines_are_held_to_the_longest_cooldown() -> None:
    """A forged entry (or a peer's clock a decade fast) cannot open a breaker or cool a target for
    longer than the breaker's longest cooldown, 300 s, as a local failure could."""
    state, _, _ = folded(["o", "u|m", 1100.0 + 1e9, 9.0], ["r", "u|m", 1100.0 + 1e9])
    health = state.health(("a", "m"), 100.0)
    assert health.state == "open" and health.seconds_left == 300.0
    assert health.cooling == 300.0


@pytest.mark.parametrize("wire", [
    pytest.param(["s", "u|m", "streamed", -1000.0, 1099.0], id="negative-sample"),
    pytest.param(["s", "u|m", "streamed", float("nan"), 1099.0], id="nan-sample"),
    pytest.param(["f", [1], 2, 3, 4], id="unhashable-target"),
    pytest.param(["o"], id="too-short"),
    pytest.param(5, id="not-a-list"),
])
def test_a_hostile_event_is_skipped_and_the_batch_goes_on(wire: Any) -> None:
    state, _, applied = folded(wire, ["s", "u|m", "streamed", 0.2, 1099.0])
    assert applied == 2  # the good sample after it, on both names
    assert state.tracker.samples(("a", "m")) == 1


def test_a_peers_two_lost_races_demote_its_leader_here_too() -> None:
    state, told, _ = folded(["s", "u|m", "streamed", 0.04, 1097.0], ["c", "u|m", "streamed", 0.3, 1098.0])
    assert state.tracker.recent(("a", "m"), "streamed") == [0.04]  # one lost race: held, a stall so far
    fold(state, "peer", [["c", "u|m", "streamed", 0.3, 1099.0]], KEYS, 100.0, lambda wall: wall - 1000.0, Peers())
    assert state.tracker.recent(("a", "m"), "streamed") == [0.3, 0.3] and told == []


@pytest.mark.parametrize(("limit", "members", "parts"), [
    pytest.param(4, 1, [4], id="alone-all-of-it"),
    pytest.param(4, 2, [2, 2], id="even"),
    pytest.param(5, 2, [3, 2], id="remainder-to-the-first"),
    pytest.param(10, 3, [4, 3, 3], id="three"),
    pytest.param(1, 2, [1, 0], id="fewer-places-than-members"),
])
def test_a_fleet_limit_is_split_into_parts_that_sum_to_it(limit: int, members: int, parts: list[int]) -> None:
    assert [split(limit, members, rank) for rank in range(members)] == parts
    assert sum(parts) == limit


def test_members_are_the_peers_heard_lately_and_an_old_heartbeat_is_not_one() -> None:
    peers = Peers()
    peers.heard("p2", {}, 10.0)
    peers.heard("p1", {"u|m": 1}, 10.0, at=9.5)
    peers.heard("old", {}, 10.0, at=5.0)  # a warm start's heartbeat from 5 s ago
    assert peers.members(10.0) == ("p1", "p2")
    assert peers.members(12.6) == ("p2",)  # p1 told at 9.5: gone after 3 s
    peers.heard("p3", {}, 12.7)
    assert peers.members(12.7) == ("p2", "p3")
    assert peers.members(16.0) == ()


@pytest.mark.parametrize(("told", "sample_at", "failures"), [
    pytest.param(90.0, 1095.0, 0, id="a-success-after-the-entry-resets-the-count"),
    pytest.param(90.0, 1085.0, 2, id="a-success-before-the-entry-resets-nothing"),
    pytest.param(None, 1095.0, 2, id="no-entry-time-dated-when-folded"),
])
def test_a_peers_failures_are_dated_by_their_entry(told: float | None, sample_at: float, failures: int) -> None:
    """A failure carries no time; its entry's does. A warm start or catch-up folds old failures now, and
    the success the same backlog brings after them (taken later) must still reset the count; a
    success older than them (samples ride the next tick) must not."""
    state = State()
    fold(state, "peer", [["f", "u|m", "503", 3, 30.0]] * 2, KEYS, 100.0, lambda wall: wall - 1000.0, Peers(), told)
    fold(state, "peer", [["s", "u|m", "streamed", 0.2, sample_at]], KEYS, 100.0, lambda wall: wall - 1000.0, Peers())
    assert state.targets[("a", "m")].breaker.failures == failures
