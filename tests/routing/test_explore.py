"""Which target a racing route looks at beside its leader, and how often (docs/adr/0023): pure tables,
clock (``NOW``) and generator injected."""

from __future__ import annotations

import random
from typing import Any

import pytest

from proxy.routing.explore import LOOK_AFTER, Prospect, worth, worthiest
from proxy.routing.hedge import PAID
from proxy.routing.plan import Ask, plan
from proxy.state import State
from proxy.state.budget import RESERVE
from proxy.state.tracker import STREAMED

from .conftest import NOW, Setup, config, fig, t

LEADING = 0.04  # the leader's figure


def p(name: str = "c", unlooked: int = 10, samples: int = 10, censored: bool = False,
      fastest: float = 0.8) -> Prospect:
    return Prospect(name, unlooked, samples, censored, fastest)


@pytest.mark.parametrize(
    ("prospect", "expected"),
    [
        pytest.param(p(), 10.0, id="requests-unlooked-at-weigh-one-each"),
        pytest.param(p(unlooked=3), 3.0, id="looked-at-lately-is-worth-little"),
        pytest.param(p(samples=4), 20.0, id="few-samples-are-uncertain-twice"),
        pytest.param(p(censored=True), 20.0, id="a-figure-on-a-censored-bound-is-uncertain-twice"),
        pytest.param(p(samples=2, censored=True), 20.0, id="uncertain-counts-once"),
        pytest.param(p(fastest=0.02), 15.0, id="it-has-shown-half-the-leaders-time-reach-one-and-a-half"),
        pytest.param(p(fastest=0.0), 20.0, id="reach-is-at-most-two"),
        pytest.param(p(fastest=0.04), 10.0, id="a-tie-with-the-leader-reaches-nothing-more"),
        pytest.param(p(fastest=0.041), 10.0, id="far-or-near-behind-the-same-reach-a-shift-is-a-shift"),
    ],
)
def test_worth(prospect: Prospect, expected: float) -> None:
    assert worth(prospect, LEADING) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prospects", "look"),
    [
        pytest.param([p("b", unlooked=LOOK_AFTER - 1)], None, id="not-due-before-look-after"),
        pytest.param([p("b", unlooked=LOOK_AFTER)], "b", id="due-at-look-after"),
        pytest.param([p("b", unlooked=12), p("c", unlooked=20)], "c", id="the-longest-unlooked-at"),
        pytest.param([p("b", unlooked=12, fastest=0.01), p("c", unlooked=20)], "b",
                     id="a-target-that-came-under-the-leader-beats-an-older-look"),
        pytest.param([p("b", unlooked=12), p("c", unlooked=7, censored=True)], "c",
                     id="an-uncertain-figure-is-due-twice-as-often"),
        pytest.param([p("b", unlooked=15), p("c", unlooked=15)], "b", id="a-tie-goes-to-the-first-written"),
        pytest.param([], None, id="nobody-behind"),
    ],
)
def test_worthiest(prospects: list[Prospect], look: str | None) -> None:
    assert worthiest(prospects, LEADING) == look


def route(**hedge: Any) -> Any:
    """a, b, c behind one racing route with the shipped hedge, no random explore, no clock refresh
    within the table (figures are fresh)."""
    return config("fastest", [t("a"), t("b"), t("c")], fastest={"explore": 0},
                  hedge={"after": "p90", "refresh": 30, **hedge})


def pool(c: tuple[float, ...] = (0.8,) * 6) -> tuple[Setup, ...]:
    return fig("a", *(0.04,) * 6), fig("b", *(0.08,) * 6), fig("c", *c)


def traffic(requests: int, tokens: float, looked: dict[str, int] | None = None) -> Setup:
    """The route has served ``requests`` requests, holds ``tokens``, and last ran each target at
    the request ``looked`` says (a leads every request); what the cold start advanced is repaid."""

    def setup(s: State) -> None:
        budget = s.budget("chat", 0.1)
        budget.requests, budget.tokens, budget.owed = requests, tokens, 0.0
        for name, at in {"a": requests, **(looked or {})}.items():
            budget.look(((name, "m"), STREAMED))
            budget.looked[((name, "m"), STREAMED)] = at

    return setup


def look_began(name: str, at: float) -> Setup:
    """The route's latest look at ``name`` began at ``at``."""
    return lambda s: s.budget("chat", 0.1).looked_at.__setitem__(((name, "m"), STREAMED), at)


def flying(name: str) -> Setup:
    """``name`` has a call in flight (a look at it runs)."""
    return lambda s: setattr(s.target((name, "m")), "in_flight", 1)


H = "id=t1; route=chat; strategy=fastest; order="


@pytest.mark.parametrize(
    ("setups", "order", "pays", "keep", "due"),
    [
        pytest.param((*pool(), traffic(30, 1.9, {"b": 30, "c": 30})),
                     "a(fastest 0.04s), b(0.08s), c(0.80s)", "", 0.0, set(), id="all-looked-at-lately"),
        pytest.param((*pool(), traffic(30, 1.9, {"b": 25, "c": 15})),
                     "c(explore 0.80s), a(0.04s), b(0.08s)", PAID, RESERVE, set(),
                     id="ten-requests-unlooked-c-is-looked-at-beside-the-leader"),
        pytest.param((*pool(), traffic(30, 1.9, {"b": 15, "c": 5})),
                     "c(explore 0.80s), a(0.04s), b(0.08s)", PAID, RESERVE, set(),
                     id="the-longest-unlooked-first"),
        pytest.param((*pool(), traffic(30, 1.85, {"b": 25, "c": 15})),
                     "a(fastest 0.04s), b(0.08s), c(0.80s)", "", 0.0, {"c"},
                     id="a-look-leaves-a-token-for-a-hedge"),
        pytest.param((*pool(), traffic(30, 0.5, {"b": 25, "c": 15})),
                     "a(fastest 0.04s), b(0.08s), c(0.80s)", "", 0.0, {"c"},
                     id="unpaid-the-look-waits-for-a-token-and-says-no-budget-exhausted"),
        pytest.param((*pool(), traffic(30, 0.5, {"b": 10, "c": 25})),
                     "a(fastest 0.04s), b(0.08s), c(0.80s)", "", 0.0, {"b"},
                     id="a-hedge-of-a-due-target-measures-it"),
        pytest.param((*pool((0.8,) * 6 + (0.01,)), traffic(30, 1.05, {"b": 30, "c": 29})),
                     "c(explore 0.17s), a(0.04s), b(0.08s)", PAID, 0.0, set(),
                     id="a-recovery-seen-once-is-confirmed-with-the-hedges-reserve-token"),
        pytest.param((*pool((0.8,) * 6 + (0.01, 0.012)), traffic(30, 1.9, {"b": 30, "c": 29})),
                     "c(fastest 0.01s), a(0.04s), b(0.08s)", "", 0.0, set(),
                     id="seen-twice-in-a-row-the-recovery-leads"),
        pytest.param((*pool((0.8,) * 6 + (0.01, 0.5, 0.012)), traffic(30, 1.9, {"b": 30, "c": 29})),
                     "c(explore 0.10s), a(0.04s), b(0.08s)", PAID, 0.0, set(),
                     id="a-slow-sample-between-breaks-the-row-the-newest-is-confirmed-again"),
        pytest.param((*pool(), traffic(30, 1.9, {"b": 30, "c": 0}), flying("c")),
                     "c(explore 0.80s), a(0.04s), b(0.08s)", PAID, RESERVE, set(),
                     id="in-flight-since-long-ago-a-look-is-due-again-it-started-before-what-it-missed"),
        pytest.param((*pool(), traffic(30, 1.9, {"b": 30, "c": 25}), flying("c")),
                     "a(fastest 0.04s), b(0.08s), c(0.80s)", "", 0.0, set(),
                     id="in-flight-since-lately-it-is-not-due"),
        pytest.param((*pool((0.8,) * 6 + (0.01,)), traffic(30, 1.05, {"b": 30, "c": 29}), flying("c"),
                      look_began("c", NOW)),
                     "a(fastest 0.04s), b(0.08s), c(0.17s)", "", 0.0, set(),
                     id="a-recovery-being-confirmed-is-not-confirmed-twice"),
        pytest.param((*pool((0.8,) * 6 + (0.01,)), traffic(30, 1.05, {"b": 30, "c": 29}), flying("c"),
                      look_began("c", NOW - 5.0)),
                     "c(explore 0.17s), a(0.04s), b(0.08s)", PAID, 0.0, set(),
                     id="a-slow-look-begun-before-the-recovery-still-in-flight-does-not-hold-back-its-confirmation"),
        pytest.param((*pool(), traffic(30, 1.9, {"b": 15, "c": 15})),
                     "b(explore 0.08s), a(0.04s), c(0.80s)", PAID, RESERVE, set(),
                     id="far-or-near-behind-a-tie-goes-to-the-first-written"),
    ],
)
def test_the_look_a_racing_route_takes(setups: tuple[Setup, ...], order: str, pays: str, keep: float,
                                      due: set[str]) -> None:
    state = State()
    for setup in setups:
        setup(state)
    planned = plan(route(), Ask("t1", "chat"), state, NOW, random.Random(7))
    assert planned.decision.header() == H + order
    race = planned.opening
    assert race is not None
    assert (race.pays, race.keep) == (pays, keep)
    assert race.due == due


def test_without_hedge_explore_no_look_is_taken() -> None:
    state = State()
    for setup in (*pool(), traffic(30, 1.9, {"b": 0, "c": 0})):
        setup(state)
    planned = plan(route(explore=False), Ask("t1", "chat"), state, NOW, random.Random(7))
    assert planned.decision.header() == H + "a(fastest 0.04s), b(0.08s), c(0.80s)"
    assert planned.opening is not None and planned.opening.due == frozenset()


@pytest.mark.parametrize(
    ("before", "after", "unlooked", "never"),
    [
        pytest.param(3, 2, 2, 5, id="counted-in-the-routes-requests-since-the-look"),
        pytest.param(4, 0, 0, 4, id="looked-at-in-this-request"),
    ],
)
def test_the_budget_counts_requests_since_a_target_ran(before: int, after: int, unlooked: int, never: int) -> None:
    from proxy.state.budget import HedgeBudget

    budget = HedgeBudget(0.1)
    for _ in range(before):
        budget.deposit()
    budget.look("c")
    for _ in range(after):
        budget.deposit()
    assert (budget.unlooked("c"), budget.unlooked("b"), budget.requests) == (unlooked, never, before + after)
