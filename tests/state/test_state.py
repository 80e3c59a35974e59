"""State's one door: every change to a target goes through a named method of State.

The table checks what each method changes; the scan checks that nothing outside ``proxy/state``
writes a target's fields or calls the breaker's or tracker's mutators itself (the fleet link
hears changes at the door, so a write around it would never reach the other instances).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.config import Cooldown
from proxy.state import State, TargetState
from proxy.state.breaker import CLOSED, GO, OPEN, PROBE, WAIT
from proxy.state.tracker import BUFFERED, STREAMED

KEY = ("p", "m")
ONE = Cooldown(failures=1, secs=10.0)
TWO = Cooldown(failures=2, secs=10.0)


def opened(state: State, ts: TargetState) -> None:
    state.failed(ts, 0.0, ONE, "503")


@pytest.mark.parametrize(("change", "expect"), [
    pytest.param(lambda s, ts: s.call_admitted(ts, False), lambda s, ts: ts.in_flight == 1 and ts.buffering == 0,
                 id="admitted-streamed"),
    pytest.param(lambda s, ts: s.call_admitted(ts, True), lambda s, ts: ts.in_flight == 1 and ts.buffering == 1,
                 id="admitted-buffered"),
    pytest.param(lambda s, ts: (s.call_admitted(ts, True), s.call_released(ts, True)),
                 lambda s, ts: ts.in_flight == 0 and ts.buffering == 0, id="admitted-then-released"),
    pytest.param(lambda s, ts: s.first_token(ts, 0.25, 1.0, STREAMED, 0),
                 lambda s, ts: s.tracker.samples(KEY, STREAMED) == 1 and s.tracker.samples(KEY, BUFFERED) == 0
                 and list(ts.history) == [True], id="first-token-streamed-sample"),
    pytest.param(lambda s, ts: s.first_token(ts, 0.25, 1.0, BUFFERED, None),
                 lambda s, ts: s.tracker.samples(KEY, BUFFERED) == 1 and s.tracker.samples(KEY, STREAMED) == 0,
                 id="first-token-buffered-sample"),
    pytest.param(lambda s, ts: (setattr(ts, "retired", True), s.first_token(ts, 0.25, 1.0, STREAMED, 0)),
                 lambda s, ts: s.tracker.samples(KEY, STREAMED) == 0 and list(ts.history) == [True],
                 id="retired-target-measures-nobody"),
    pytest.param(lambda s, ts: s.censored(ts, 2.0, 1.0, STREAMED),
                 lambda s, ts: s.tracker.samples(KEY, STREAMED) == 1 and not ts.history, id="censored-sample"),
    pytest.param(lambda s, ts: (s.first_token(ts, 0.04, 1.0, STREAMED, 0), s.censored(ts, 0.14, 2.0, STREAMED, 0.1)),
                 lambda s, ts: s.tracker.held(KEY) == 1 and s.tracker.recent(KEY, STREAMED) == [0.04],
                 id="one-lost-race-held"),
    pytest.param(lambda s, ts: (s.first_token(ts, 0.04, 1.0, STREAMED, 0), s.censored(ts, 0.14, 2.0, STREAMED, 0.2),
                                s.censored(ts, 0.14, 3.0, STREAMED, 0.2)),
                 lambda s, ts: s.tracker.recent(KEY, STREAMED) == [pytest.approx(0.21)] * 2,
                 id="two-lost-races-demote-behind-the-winner"),
    pytest.param(lambda s, ts: (s.first_token(ts, 0.04, 1.0, STREAMED, 0), s.heard_sample(ts, 0.3, 2.0, STREAMED, True),
                                s.heard_sample(ts, 0.3, 3.0, STREAMED, True)),
                 lambda s, ts: s.tracker.recent(KEY, STREAMED) == [0.3, 0.3] and list(ts.history) == [True],
                 id="a-peers-two-lost-races-demote-here-too"),
    pytest.param(lambda s, ts: s.failed(ts, 0.0, TWO, "503"),
                 lambda s, ts: ts.breaker.failures == 1 and s.health(KEY, 0.0).usable and list(ts.history) == [False],
                 id="one-failure-under-threshold"),
    pytest.param(opened, lambda s, ts: s.health(KEY, 1.0).state == OPEN, id="failure-at-threshold-opens"),
    pytest.param(lambda s, ts: (opened(s, ts), s.first_token(ts, 0.1, 11.0, STREAMED, 0)),
                 lambda s, ts: s.health(KEY, 11.0).usable and ts.breaker.failures == 0, id="success-closes"),
    pytest.param(lambda s, ts: s.cool(ts, 5.0, 1.0),
                 lambda s, ts: not s.health(KEY, 1.0).usable and s.health(KEY, 5.0).usable, id="retry-after-cools"),
    pytest.param(lambda s, ts: (opened(s, ts), s.admit(ts, 11.0)),
                 lambda s, ts: s.admit(ts, 11.0) == WAIT, id="probe-claimed-others-wait"),
    pytest.param(lambda s, ts: (opened(s, ts), s.admit(ts, 11.0), s.probe_released(ts)),
                 lambda s, ts: s.admit(ts, 11.0) == PROBE, id="probe-released-next-probes"),
    pytest.param(lambda s, ts: None, lambda s, ts: s.admit(ts, 0.0) == GO, id="closed-admits"),
])
def test_each_change_has_its_method(change: Callable[[State, TargetState], Any],
                                    expect: Callable[[State, TargetState], bool]) -> None:
    state = State()
    ts = state.target(KEY)
    change(state, ts)
    assert expect(state, ts)


def named(state: State) -> State:
    state.instance = "me"
    return state


@pytest.mark.parametrize(("change", "figure_by", "breaker_by"), [
    pytest.param(lambda s, ts: s.first_token(ts, 0.2, 1.0, STREAMED, 0), ("me", "streamed sample", 1.0), None,
                 id="own-sample"),
    pytest.param(lambda s, ts: (opened(s, ts), s.first_token(ts, 0.2, 11.0, BUFFERED, 0)),
                 ("me", "buffered sample", 11.0), ("me", "closed", 11.0), id="own-answer-closes"),
    pytest.param(lambda s, ts: s.censored(ts, 0.3, 2.0, STREAMED), ("me", "streamed bound", 2.0), None,
                 id="own-bound"),
    pytest.param(lambda s, ts: s.failed(ts, 3.0, TWO, "timeout"), None, ("me", "failure timeout", 3.0),
                 id="own-failure-under-threshold"),
    pytest.param(opened, None, ("me", "opened", 0.0), id="own-opening"),
    pytest.param(lambda s, ts: s.cool(ts, 9.0, 4.0), None, ("me", "cooled", 4.0), id="own-retry-after"),
    pytest.param(lambda s, ts: s.heard_sample(ts, 0.2, 5.0, STREAMED, False, "peer"),
                 ("peer", "streamed sample", 5.0), None, id="peers-sample"),
    pytest.param(lambda s, ts: (opened(s, ts), s.heard_sample(ts, 0.2, 12.0, STREAMED, False, "peer")),
                 ("peer", "streamed sample", 12.0), ("peer", "closed", 12.0), id="peers-answer-closes"),
    pytest.param(lambda s, ts: s.heard_failure(ts, 6.0, ONE, "peer"), None, ("peer", "opened", 6.0),
                 id="peers-failure-opens-here"),
    pytest.param(lambda s, ts: s.heard_failure(ts, 6.0, TWO, "peer"), None, ("peer", "failure", 6.0),
                 id="peers-failure-counts"),
    pytest.param(lambda s, ts: (opened(s, ts), s.heard_open(ts, 10.0, 10.0, "peer", 7.0)), None,
                 ("me", "opened", 0.0), id="peers-same-opening-changes-nothing"),
    pytest.param(lambda s, ts: (opened(s, ts), s.heard_open(ts, 30.0, 20.0, "peer", 7.0)), None,
                 ("peer", "opened", 7.0), id="peers-reopening"),
    pytest.param(lambda s, ts: s.heard_cool(ts, 20.0, "peer", 8.0), None, ("peer", "cooled", 8.0),
                 id="peers-retry-after"),
])
def test_each_change_says_who_made_it_and_when(change: Callable[[State, TargetState], Any],
                                               figure_by: Any, breaker_by: Any) -> None:
    state = named(State())
    ts = state.target(KEY)
    change(state, ts)
    assert (ts.figure_by, ts.breaker_by) == (figure_by, breaker_by)


@pytest.mark.parametrize(("measuring", "local", "mode", "want"), [
    pytest.param(frozenset(), 0, STREAMED, 0, id="nobody"),
    pytest.param(frozenset({(KEY, STREAMED)}), 0, STREAMED, 1, id="a-peer-measures-it"),
    pytest.param(frozenset({(KEY, STREAMED)}), 1, STREAMED, 2, id="a-peer-and-a-call-of-ours"),
    pytest.param(frozenset({(KEY, BUFFERED)}), 0, STREAMED, 0, id="the-other-mode-is-another-figure"),
    pytest.param(frozenset({(KEY, STREAMED)}), 1, None, 1, id="the-load-is-our-calls-only"),
])
def test_a_peers_measuring_claim_counts_as_a_call_measuring_the_target(
        measuring: frozenset[Any], local: int, mode: str | None, want: int) -> None:
    state = State()
    if local:
        state.call_admitted(state.target(KEY), False)
    state.set_measuring(measuring)
    assert state.in_flight(KEY, mode) == want


def test_costs_are_swapped_in_whole() -> None:
    state = State()
    state.set_costs({("a", "chat"): 0.002})
    assert state.costs == {("a", "chat"): 0.002}


FIELDS = {"in_flight", "buffering", "retired", "failures", "state", "open_until", "cool_until", "probing",
          "cooldown", "costs", "figure_by", "breaker_by", "measuring"}
MUTATORS = {("breaker", "begin"), ("breaker", "success"), ("breaker", "failure"), ("breaker", "cool"),
            ("breaker", "abandon_probe"), ("history", "append"), ("tracker", "record"), ("tracker", "censor")}


def writes_around_the_door(tree: ast.AST) -> list[str]:
    """Assignments to a target's fields and calls of its parts' mutators, as ``line: what``."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.AugAssign):
            targets = [node.target]
        elif isinstance(node, ast.Assign):
            targets = node.targets
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in FIELDS and not (
                    isinstance(t.value, ast.Name) and t.value.id == "self"):
                found.append(f"{node.lineno}: .{t.attr} =")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and (owner.attr, node.func.attr) in MUTATORS:
                found.append(f"{node.lineno}: .{owner.attr}.{node.func.attr}()")
    return found


def test_nothing_outside_state_writes_a_target() -> None:
    root = Path(__file__).resolve().parents[2] / "proxy"
    offenders = {}
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "state":
            continue
        found = writes_around_the_door(ast.parse(path.read_text(), str(path)))
        if found:
            offenders[str(path.relative_to(root))] = found
    assert offenders == {}


def test_the_scan_sees_a_write_around_the_door() -> None:
    """The scan is no assert that cannot fail: the writes the walk used to make are found."""
    code = ("ts.in_flight += 1\nts.breaker.failure(now, c)\nstate.tracker.record(k, 1.0, now)\n"
            "slot.ts.history.append(True)\n")
    assert len(writes_around_the_door(ast.parse(code))) == 4


def test_the_fleet_hears_a_lost_race_as_its_bound_lifted_over_the_winner() -> None:
    state, told = State(), []
    state.listener = told.append
    ts = state.target(KEY)
    state.censored(ts, 0.14, 2.0, STREAMED, behind=0.2)
    state.censored(ts, 0.3, 3.0, STREAMED)
    assert told == [("c", KEY, STREAMED, pytest.approx(0.21)), ("c", KEY, STREAMED, 0.3)]


def test_targets_only_a_pin_names_are_bounded_least_recently_asked_first() -> None:
    """A client naming a new ``provider/model`` every call grew memory without bound (a reviewer's
    10,000 names: +36 MB); past ``UNLISTED_MAX`` the least recently asked idle one is forgotten,
    while a listed target, or one with a call in flight, is kept."""
    from proxy.state import UNLISTED_MAX

    state = State()
    state.listed = {("p", "listed")}
    listed = state.target(("p", "listed"))
    state.first_token(listed, 0.2, 1.0, STREAMED, 0)
    busy = state.target(("p", "busy"))
    state.call_admitted(busy, False)
    asked_again = ("p", "pin-0")
    for i in range(UNLISTED_MAX + 500):
        ts = state.target(("p", f"pin-{i}"))
        state.first_token(ts, 0.3, 1.0, STREAMED, 0)
        state.target(asked_again)  # asked all along: the most recent, never the one forgotten
    unlisted = [k for k in state.targets if k != ("p", "listed")]
    assert len(unlisted) == UNLISTED_MAX
    assert ("p", "listed") in state.targets and state.tracker.samples(("p", "listed")) == 1
    assert ("p", "busy") in state.targets and asked_again in state.targets
    assert ("p", "pin-1") not in state.targets and state.tracker.samples(("p", "pin-1")) == 0
    assert (("p", f"pin-{UNLISTED_MAX + 499}")) in state.targets
    assert sum(len(by_key) for by_key in state.tracker.modes.values()) <= UNLISTED_MAX + 1


THREE = Cooldown(failures=3, secs=10.0)


@pytest.mark.parametrize(("change", "failures", "state"), [
    pytest.param(lambda s, ts: (s.failed(ts, 5.0, THREE, "503"), s.failed(ts, 6.0, THREE, "503"),
                                s.heard_sample(ts, 0.2, 4.0, STREAMED, False, "peer")), 2, CLOSED,
                 id="own-failures-an-older-success-resets-nothing"),
    pytest.param(lambda s, ts: (s.heard_failure(ts, 5.0, THREE, "peer"), s.heard_failure(ts, 6.0, THREE, "peer"),
                                s.heard_sample(ts, 0.2, 4.0, STREAMED, False, "peer")), 2, CLOSED,
                 id="heard-failures-an-older-success-resets-nothing"),
    pytest.param(lambda s, ts: ([s.heard_failure(ts, 5.0 + i, THREE, "peer") for i in range(3)],
                                s.heard_sample(ts, 0.2, 6.5, STREAMED, False, "peer")), 3, OPEN,
                 id="heard-failures-opened-an-older-success-closes-nothing"),
    pytest.param(lambda s, ts: (s.heard_open(ts, 15.0, 10.0, "peer", 5.0),
                                s.heard_sample(ts, 0.2, 4.0, STREAMED, False, "peer")), 0, OPEN,
                 id="heard-opening-an-older-success-closes-nothing"),
    pytest.param(lambda s, ts: (s.heard_failure(ts, 5.0, THREE, "peer"), s.heard_failure(ts, 6.0, THREE, "peer"),
                                s.heard_sample(ts, 0.2, 7.0, STREAMED, False, "peer")), 0, CLOSED,
                 id="a-newer-success-resets-the-count"),
    pytest.param(lambda s, ts: (s.heard_failure(ts, 7.0, THREE, "peer", 3.0),
                                s.heard_failure(ts, 7.0, THREE, "peer", 3.5),
                                s.heard_sample(ts, 0.2, 4.0, STREAMED, False, "peer")), 0, CLOSED,
                 id="a-backlogs-failures-dated-by-their-entry-a-success-after-them-resets"),
])
def test_a_peers_success_older_than_a_failure_known_here_closes_nothing(
        change: Callable[[State, TargetState], Any], failures: int, state: str) -> None:
    """A peer's samples ride its next tick (up to a second late) while failures go at once: a success
    taken before failures known here (counted, heard, or an opening heard) is a sample, not a reset of
    the count nor a close (docs/adr/0016, "what a late success closes"). A heard failure is dated when
    folded, as the ADR says: it was not dated at all, so a late success reset a count of peers' failures
    and closed a breaker they had opened here."""
    s = State()
    ts = s.target(KEY)
    change(s, ts)
    assert (ts.breaker.failures, s.health(KEY, 8.0).state) == (failures, state)
