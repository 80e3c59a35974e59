"""When a hedge starts, the budget that pays for it, and how a racing route orders: pure tables."""

from __future__ import annotations

import random
from typing import Any

import pytest

from proxy.config import Hedge
from proxy.routing.hedge import MIN_SAMPLES, hedge_delay
from proxy.routing.plan import Ask, plan
from proxy.state import State
from proxy.state.budget import CAP, HedgeBudget

from .test_plan import NOW, config, fig, t


@pytest.mark.parametrize(
    ("hedge", "samples", "delay"),
    [
        pytest.param(Hedge(after_secs=0.8, after_percentile=None), [], 0.8, id="fixed-seconds-need-no-samples"),
        pytest.param(Hedge(after_percentile=90), [0.1] * (MIN_SAMPLES - 1), None, id="too-few-samples-no-hedge"),
        pytest.param(Hedge(after_percentile=90), [i / 10 for i in range(1, 11)], 0.9, id="p90-of-ten"),
        pytest.param(Hedge(after_percentile=50), [0.3, 0.1, 0.2, 0.5, 0.4], 0.3, id="p50-is-the-median"),
        pytest.param(Hedge(after_percentile=99), [0.1] * 200 + [9.0] * 2, 9.0, id="p99-of-the-newest-hundred"),
        pytest.param(Hedge(after_percentile=90), [5.0] * 100 + [0.1] * 100, 0.1, id="old-samples-are-forgotten"),
    ],
)
def test_hedge_delay(hedge: Hedge, samples: list[float], delay: float | None) -> None:
    assert hedge_delay(hedge, samples) == delay


@pytest.mark.parametrize(
    ("share", "requests", "hedges"),
    [
        pytest.param(0.1, 1, 1, id="a-cold-route-may-race-its-first-request"),
        pytest.param(0.1, 100, 10, id="a-tenth-over-a-hundred"),
        pytest.param(0.1, 300, 30, id="a-tenth-over-three-hundred"),
        pytest.param(0.0, 50, 1, id="zero-share-only-the-start"),
        pytest.param(1.0, 20, 20, id="every-request"),
    ],
)
def test_budget_when_every_request_wants_a_hedge(share: float, requests: int, hedges: int) -> None:
    budget = HedgeBudget(share)
    granted = 0
    for _ in range(requests):
        budget.deposit()
        granted += budget.withdraw()
    assert granted == hedges
    assert budget.refused == requests - hedges


def test_a_quiet_route_saves_at_most_cap_tokens() -> None:
    budget = HedgeBudget(0.5)
    for _ in range(100):
        budget.deposit()
    assert sum(budget.withdraw() for _ in range(20)) == int(CAP)


def racing(strategy: str = "fastest", **route: Any) -> Any:
    return config(strategy, [t("a"), t("b"), t("c")], hedge={"after": 1, "refresh": 5}, **route)


def in_flight(name: str, n: int = 1) -> Any:
    def setup(s: State) -> None:
        s.target((name, "m")).in_flight = n

    return setup


H = "id=t1; route=chat; strategy=fastest; order="


@pytest.mark.parametrize(
    ("cfg", "setups", "order", "together"),
    [
        pytest.param(racing(), (), "a(unmeasured), b(unmeasured), c(unmeasured)", 2,
                     id="cold-start-two-unmeasured-race"),
        pytest.param(racing(), (in_flight("a"),), "b(unmeasured), c(unmeasured), a(unmeasured)", 2,
                     id="a-target-being-measured-is-not-put-first-again"),
        pytest.param(racing(), (in_flight("a", 3), in_flight("b", 1), in_flight("c", 2)),
                     "b(unmeasured), c(unmeasured), a(unmeasured)", 2,
                     id="all-being-measured-least-in-flight-first-a-cold-burst-spreads"),
        pytest.param(racing(), (fig("a", 0.2), in_flight("b"), fig("c", 0.5)),
                     "a(fastest 0.20s), c(0.50s), b(unmeasured)", 1,
                     id="while-b-is-measured-requests-go-by-the-figures-that-exist"),
        pytest.param(racing(fastest={"explore": 0}), (fig("a", 0.2), fig("b", 0.3), fig("c", 0.5, ago=6)),
                     "c(explore 0.50s), a(0.20s), b(0.30s)", 2, id="a-stale-figure-is-explored-under-a-race"),
        pytest.param(racing(fastest={"explore": 0}),
                     (fig("a", 0.2), fig("b", 0.3), fig("c", 0.5, ago=6), in_flight("c")),
                     "a(fastest 0.20s), b(0.30s), c(0.50s)", 1, id="a-stale-target-already-in-flight-is-not"),
        pytest.param(config("fastest", [t("a"), t("b")], fastest={"explore": 0}),
                     (fig("a", 0.2), fig("b", 0.3, ago=60)), "a(fastest 0.20s), b(0.30s)", 1,
                     id="without-hedge-staleness-explores-nothing"),
        pytest.param(racing(fastest={"explore": 0, "load_aware": True}),
                     (fig("a", 0.2), fig("b", 0.3), fig("c", 0.5), in_flight("a", 2)),
                     "b(fastest 0.30s), c(0.50s), a(0.60s)", 1, id="load-aware-a-busy-leader-steps-back"),
        pytest.param(racing(fastest={"explore": 0, "load_aware": True, "load_weight": 0.1}),
                     (fig("a", 0.2), fig("b", 0.3), fig("c", 0.5), in_flight("a", 2)),
                     "a(fastest 0.24s), b(0.30s), c(0.50s)", 1, id="load-weight-scales-the-penalty"),
        pytest.param(racing(fastest={"explore": 0}), (fig("a", 0.2), fig("b", 0.3), fig("c", 0.5), in_flight("a", 9)),
                     "a(fastest 0.20s), b(0.30s), c(0.50s)", 1, id="load-unaware-by-default"),
        pytest.param(config("fastest", [t("a"), t("b")], hedge={"after": 1, "explore": False}), (),
                     "a(unmeasured), b(unmeasured)", 1, id="hedge-explore-off-measures-alone"),
    ],
)
def test_racing_order(cfg: Any, setups: tuple[Any, ...], order: str, together: int) -> None:
    state = State()
    for setup in setups:
        setup(state)
    planned = plan(cfg, Ask("t1", "chat"), state, NOW, random.Random(7))
    assert planned.decision.header() == H + order
    assert planned.together == together
