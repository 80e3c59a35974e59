"""The state's snapshot: what observers read instead of the live state."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.config import Config, Cooldown, Fastest, Provider, Route, Target
from proxy.state import State
from proxy.state.tracker import BUFFERED, STREAMED

A = Target(name="a", provider="p", model="m1")
B = Target(name="b", provider="p", model="m2")
CONFIG = Config(
    providers={"p": Provider(name="p", kind="simulated")},
    routes={
        "chat": Route(name="chat", strategy="fastest", targets=(A, B), cooldown=Cooldown(failures=1)),
        "slow": Route(name="slow", strategy="fastest", targets=(A,), fastest=Fastest(alpha=0.5)),
    },
)


def state() -> State:
    s = State()
    s.configure(CONFIG)
    s.tracker.record(A.key, 1.0, 10.0)
    s.tracker.record(A.key, 0.0, 20.0)
    s.tracker.record(B.key, 0.4, 20.0, BUFFERED)
    s.target(B.key).in_flight = 2
    return s


@pytest.mark.parametrize(
    ("index", "route", "target", "mode", "figure", "samples", "age"),
    [
        pytest.param(0, "chat", "a", STREAMED, 0.9, 2, 10.0, id="route-policy-alpha-0.1"),
        pytest.param(0, "chat", "a", BUFFERED, None, 0, None, id="other-mode-unmeasured"),
        pytest.param(1, "chat", "b", BUFFERED, 0.4, 1, 10.0, id="buffered-series"),
        pytest.param(2, "slow", "a", STREAMED, 0.5, 2, 10.0, id="shared-target-under-its-second-route"),
    ],
)
def test_snapshot_figures(index: int, route: str, target: str, mode: str, figure: float | None, samples: int,
                          age: float | None) -> None:
    got = state().snapshot(CONFIG, 30.0)[index]
    assert (got.route, got.target.name) == (route, target)
    series = got.modes[mode]
    assert series.figure == (None if figure is None else pytest.approx(figure))
    assert (series.samples, series.age) == (samples, age)


def test_snapshot_carries_health_and_load_and_cannot_be_written() -> None:
    snap = state().snapshot(CONFIG, 30.0)
    assert [(f.target.name, f.health.state, f.in_flight) for f in snap] == [
        ("a", "closed", 0), ("b", "closed", 2), ("a", "closed", 0)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap[1].in_flight = 0  # type: ignore[misc]
