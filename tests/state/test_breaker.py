"""The breaker as a pure state machine: an injected ``now``, no sleeping."""

from __future__ import annotations

import pytest

from proxy.config import Cooldown
from proxy.state.breaker import CLOSED, GO, HALF_OPEN, MAX_COOLDOWN, OPEN, PROBE, PROBING, WAIT, Breaker

POLICY = Cooldown(failures=3, secs=30.0)


def opened(now: float = 0.0) -> Breaker:
    b = Breaker()
    for _ in range(POLICY.failures):
        b.failure(now, POLICY)
    return b


def test_opens_only_after_consecutive_failures() -> None:
    b = Breaker()
    b.failure(0, POLICY)
    b.failure(1, POLICY)
    assert b.health(1).state == CLOSED and b.health(1).failures == 2
    b.success()  # not consecutive any more
    b.failure(2, POLICY)
    b.failure(3, POLICY)
    assert b.health(3).usable
    b.failure(4, POLICY)
    h = b.health(4)
    assert (h.state, h.seconds_left, h.usable, h.reason) == (OPEN, 30.0, False, "breaker open 30s")


def test_open_waits_then_lets_exactly_one_probe_through() -> None:
    b = opened(0)
    assert b.begin(29.9) == WAIT
    assert b.health(30).state == HALF_OPEN and b.health(30).usable
    assert b.begin(30) == PROBE
    assert b.health(31).state == PROBING and not b.health(31).usable
    assert b.begin(31) == WAIT  # a request planned while half-open does not become a second probe
    assert b.health(31).reason == "breaker probing"


def test_probe_success_closes_and_resets() -> None:
    b = opened(0)
    assert b.begin(30) == PROBE
    b.failure(30, POLICY)  # cooldown now 60 s
    assert b.begin(90) == PROBE
    b.success()
    h = b.health(90)
    assert (h.state, h.failures, h.usable) == (CLOSED, 0, True)
    assert b.begin(90) == GO
    b = _reopen(b, 100)
    assert b.health(100).seconds_left == POLICY.secs  # the doubled cooldown does not stick after a close


def _reopen(b: Breaker, now: float) -> Breaker:
    for _ in range(POLICY.failures):
        b.failure(now, POLICY)
    return b


@pytest.mark.parametrize(
    ("failed_probes", "cooldown"),
    [
        pytest.param(1, 60.0, id="one-failed-probe-doubles"),
        pytest.param(2, 120.0, id="two-failed-probes-quadruple"),
        pytest.param(4, 300.0, id="capped-at-300s"),
        pytest.param(6, 300.0, id="stays-capped"),
    ],
)
def test_failed_probe_doubles_the_cooldown_up_to_300s(failed_probes: int, cooldown: float) -> None:
    b = opened(0)
    now = 0.0
    for _ in range(failed_probes):
        now = b.open_until
        assert b.begin(now) == PROBE
        b.failure(now, POLICY)
    assert b.cooldown == cooldown <= MAX_COOLDOWN
    h = b.health(now)
    assert (h.state, h.seconds_left) == (OPEN, cooldown)


def test_failure_while_open_without_probe_changes_nothing_but_the_count() -> None:
    b = opened(0)
    b.failure(10, POLICY)  # e.g. the health rescue failed too
    assert b.open_until == 30 and b.cooldown == 30
    assert b.health(10).failures == 4


def test_abandoned_probe_lets_the_next_request_probe() -> None:
    b = opened(0)
    assert b.begin(30) == PROBE
    b.abandon_probe()  # the client left, or the upstream answered with a client error
    assert b.health(31).state == HALF_OPEN
    assert b.begin(31) == PROBE


def test_rescue_goes_through_an_open_breaker_without_probing() -> None:
    b = opened(0)
    assert b.begin(5, rescue=True) == GO
    assert b.health(5).state == OPEN  # not a probe: the breaker's own clock is untouched


def test_retry_after_cools_without_opening() -> None:
    b = Breaker()
    b.cool(17.0)
    b.cool(12.0)  # a shorter hint never shortens a longer one
    h = b.health(10.0)
    assert (h.state, h.cooling, h.usable, h.reason, h.reopens_in) == (CLOSED, 7.0, False, "cooling down 7s", 7.0)
    assert b.health(17.0).usable


def test_reopens_in_orders_the_health_rescue() -> None:
    b = opened(0)
    b.cool(50)
    assert b.health(10).reopens_in == 40  # the later of breaker and cool-down
    assert b.health(10).reason == "breaker open 40s"
    p = opened(0)
    p.begin(30)
    assert p.health(31).reopens_in == 0  # a probe in flight may answer any moment
