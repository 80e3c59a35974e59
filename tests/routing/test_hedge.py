"""When a hedge starts, the budget that pays for it, and how a racing route orders: pure tables."""

from __future__ import annotations

import random
from typing import Any

import pytest

from proxy.config import Hedge
from proxy.errors import ConfigError
from proxy.routing.hedge import (
    BORROWED,
    CAP_CEILING,
    CAP_FLOOR,
    FREE,
    MIN_SAMPLES,
    PAID,
    hedge_delay,
    measure_cap,
    opening,
)
from proxy.routing.plan import Ask, plan
from proxy.state import State
from proxy.state.budget import CAP, RESERVE, HedgeBudget
from proxy.state.tracker import BUFFERED, STREAMED

from .conftest import NOW, config, fig, t


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


@pytest.mark.parametrize(
    ("hedge", "winner", "cap"),
    [
        pytest.param(Hedge(), 0.5, 2.0, id="four-times-the-winners-first-token"),
        pytest.param(Hedge(), 0.02, CAP_FLOOR, id="a-fast-winner-leaves-the-floor"),
        pytest.param(Hedge(), 3.0, CAP_CEILING, id="a-slow-winner-meets-the-ceiling"),
        pytest.param(Hedge(cap=2.0), 0.5, 1.0, id="the-knob-is-the-multiple"),
        pytest.param(Hedge(), None, CAP_CEILING, id="a-client-error-answer-has-no-first-token"),
    ],
)
def test_measure_cap(hedge: Hedge, winner: float | None, cap: float) -> None:
    assert measure_cap(hedge, winner) == cap


@pytest.mark.parametrize(
    ("cap", "problem"),
    [
        pytest.param(0.5, "routes.chat.hedge.cap: must be at least 1, got 0.5", id="under-one-would-cut-a-tie"),
        pytest.param("4x", "routes.chat.hedge.cap: expected a number, got '4x'", id="not-a-number"),
    ],
)
def test_hedge_cap_is_validated_with_its_path(cap: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config("fastest", [t("a"), t("b")], hedge={"cap": cap})
    assert problem in str(caught.value)


def test_budget_refuses_a_request_once() -> None:
    budget = HedgeBudget(0.0)
    budget.withdraw()  # the start's token
    assert not budget.withdraw() and not budget.withdraw(count=False)
    assert budget.refused == 1


def racing(strategy: str = "fastest", **route: Any) -> Any:
    return config(strategy, [t("a"), t("b"), t("c")], hedge={"after": 1, "refresh": 5}, **route)


def refreshing(refresh: float = 1.0) -> Any:
    """A route whose figures go stale after ``refresh`` seconds. A sample describes the upstream when
    its call started: a 0.8 s answer that arrived 0.5 s ago measured the target 1.3 s ago."""
    return config("fastest", [t("a"), t("b"), t("c")], fastest={"explore": 0},
                  hedge={"after": 1, "refresh": refresh})


def in_flight(name: str, n: int = 1, buffered: int = 0) -> Any:
    def setup(s: State) -> None:
        ts = s.target((name, "m"))
        ts.in_flight, ts.buffering = n + buffered, buffered

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
        pytest.param(config("fastest", [t("a"), t("b")], fastest={"explore": 0}, hedge=False),
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
        pytest.param(racing(), (in_flight("a", 0, buffered=2),), "a(unmeasured), b(unmeasured), c(unmeasured)", 2,
                     id="buffered-calls-in-flight-do-not-measure-the-streamed-figure"),
        pytest.param(racing(fastest={"explore": 0}), (fig("a", 0.2), fig("b", 0.3), fig("c", 0.5, 0.5, 0.5, 0.15)),
                     "c(explore 0.22s), a(0.20s), b(0.30s)", 2,
                     id="a-newest-sample-that-beats-the-leader-is-confirmed-at-once"),
        pytest.param(racing(fastest={"explore": 0}),
                     (fig("a", 0.2), fig("b", 0.3), fig("c", 0.5, 0.5, 0.5, 0.15), in_flight("c")),
                     "a(fastest 0.20s), c(0.22s), b(0.30s)", 1, id="a-recovery-being-confirmed-is-not-raced-twice"),
        pytest.param(refreshing(), (fig("a", 0.2), fig("b", 0.3, ago=0.5), fig("c", 0.8, ago=0.5)),
                     "c(explore 0.80s), a(0.20s), b(0.30s)", 2,
                     id="a-slow-figure-is-as-old-as-its-calls-start"),
        pytest.param(refreshing(), (fig("a", 0.2), fig("b", 0.3, ago=0.5), fig("c", 0.3, ago=0.5)),
                     "a(fastest 0.20s), b(0.30s), c(0.30s)", 1,
                     id="started-within-the-refresh-is-not-stale"),
        pytest.param(refreshing(), (fig("a", 0.2), fig("b", 0.3, ago=0.9), fig("c", 0.8, ago=0.5)),
                     "c(explore 0.80s), a(0.20s), b(0.30s)", 2,
                     id="the-oldest-by-its-start-not-by-its-arrival"),
        pytest.param(refreshing(2.0), (fig("a", 0.2), fig("b", 0.3, ago=0.9), fig("c", 0.8, ago=0.5)),
                     "a(fastest 0.20s), b(0.30s), c(0.80s)", 1, id="the-knob-is-the-age"),
    ],
)
def test_racing_order(cfg: Any, setups: tuple[Any, ...], order: str, together: int) -> None:
    state = State()
    for setup in setups:
        setup(state)
    planned = plan(cfg, Ask("t1", "chat"), state, NOW, random.Random(7))
    assert planned.decision.header() == H + order
    assert planned.together == together


def loaded(name: str, *points: tuple[int, float]) -> Any:
    """Samples taken with ``load`` other calls in flight at the target: its load line (the calls in
    the order they began, the newest ending at NOW)."""

    def setup(s: State) -> None:
        at = NOW - sum(secs for _, secs in points[1:])
        for i, (load, secs) in enumerate(points):
            at += secs if i else 0.0  # each begun as the one before ended
            s.tracker.record((name, "m"), secs, at, load=load)

    return setup


# a: 0.02 s idle, 0.10 s with four others in flight (a figure of about 0.06 at a mean load of 2);
# b: 0.05 s at any load.
SLOPED = loaded("a", *((0, 0.02), (4, 0.10)) * 20)
FLAT = loaded("b", *((0, 0.05), (4, 0.05)) * 20)
C = fig("c", 0.5)


@pytest.mark.parametrize(
    ("cfg", "setups", "order"),
    [
        pytest.param(racing(fastest={"explore": 0}), (SLOPED, FLAT, C), "a(fastest 0.02s), b(0.05s), c(0.50s)",
                     id="an-idle-leader-is-ranked-by-its-line-at-no-load-not-by-its-loaded-figure"),
        pytest.param(racing(fastest={"explore": 0}), (SLOPED, FLAT, C, in_flight("a", 3), in_flight("b", 3)),
                     "b(fastest 0.05s), a(0.08s), c(0.50s)", id="a-busy-one-steps-back-a-flat-one-does-not"),
        pytest.param(racing(fastest={"explore": 0, "load_fit": False}), (SLOPED, FLAT, C),
                     "b(fastest 0.05s), a(0.06s), c(0.50s)", id="load-fit-off-ranks-by-the-figure"),
        pytest.param(config("fastest", [t("a"), t("b"), t("c")], fastest={"explore": 0}, hedge=False),
                     (SLOPED, FLAT, C),
                     "b(fastest 0.05s), a(0.06s), c(0.50s)", id="off-without-hedge"),
        pytest.param(racing(fastest={"explore": 0, "load_weight": 0.5}), (SLOPED, FLAT, C),
                     "a(fastest 0.04s), b(0.05s), c(0.50s)", id="load-weight-scales-the-fit"),
    ],
)
def test_the_load_fit_moves_a_figure_along_its_targets_line(cfg: Any, setups: tuple[Any, ...], order: str) -> None:
    state = State()
    for setup in setups:
        setup(state)
    planned = plan(cfg, Ask("t1", "chat"), state, NOW, random.Random(7))
    assert planned.decision.header() == H + order


def test_a_buffered_request_measures_a_target_busy_only_with_streams() -> None:
    cfg = racing()
    state = State()
    in_flight("a", 2)(state)  # streamed calls: the buffered figure is still unmeasured and nobody measures it
    planned = plan(cfg, Ask("t1", "chat", mode=BUFFERED), state, NOW, random.Random(7))
    assert planned.decision.header() == H + "a(unmeasured), b(unmeasured), c(unmeasured)"


@pytest.mark.parametrize("after", ["p0", "p100", "P90", "-1", "soon"])
def test_hedge_after_names_the_percentiles_it_takes(after: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config("fastest", [t("a"), t("b")], hedge={"after": after})
    assert ("routes.chat.hedge.after: expected seconds (0.8) or pNN of the leader's samples, p1 to p99 (p90), "
            f"got {after!r}") in str(caught.value)


def tokens(n: float, share: float = 0.1) -> Any:
    """The route's hedge budget holds ``n`` tokens before this request's deposit of ``share`` (a warm
    route: its start token and free measures repaid)."""
    def setup(s: State) -> None:
        budget = s.budget("chat", share)
        budget.tokens, budget.owed = n, 0.0

    return setup


def owing(n: float, owed: float) -> Any:
    """A cold route: ``n`` tokens, ``owed`` of its advances (start token, free measures) unrepaid."""
    def setup(s: State) -> None:
        budget = s.budget("chat", 0.1)
        budget.tokens, budget.owed = n, owed

    return setup


def freed(name: str, at: float) -> Any:
    """``name`` had its free measure at ``at`` (streamed), and no sample came since."""
    def setup(s: State) -> None:
        s.budget("chat", 0.1).freed[((name, "m"), STREAMED)] = at

    return setup


def lent(name: str) -> Any:
    """``name`` was measured once on a borrowed token already (streamed)."""
    def setup(s: State) -> None:
        s.budget("chat", 0.1).lent.add(((name, "m"), STREAMED))

    return setup


ABC = config("fastest", [t("a"), t("b"), t("c")], hedge={"after": 1})


@pytest.mark.parametrize(
    ("first", "together", "setups", "race"),
    [
        pytest.param("fastest", 1, (), ("a b c", None, "", "", 0.0, None), id="nobody-learns-the-order-walks-alone"),
        pytest.param("unmeasured", 2, (), ("a b c", "a", "measure", FREE, 0.0, None),
                     id="unmeasured-races-free-the-first-time"),
        pytest.param("unmeasured", 2, (freed("a", NOW - 1), tokens(1.95)),
                     ("a b c", "a", "measure", PAID, RESERVE, None),
                     id="its-free-measure-spent-it-pays-leaving-the-reserve"),
        pytest.param("unmeasured", 2, (freed("a", NOW - 1), tokens(1.0)), ("b a c", None, "", "", 0.0, "a"),
                     id="unpaid-it-waits-behind-the-leader"),
        pytest.param("unmeasured", 2, (freed("a", NOW - 1), owing(1.0, 1.5)),
                     ("a b c", "a", "measure", PAID, 0.0, None),
                     id="while-the-cold-start-is-repaid-a-measure-may-take-the-start-token"),
        pytest.param("unmeasured", 2, (freed("a", NOW - 1), owing(0.0, 1.5)),
                     ("a b c", "a", "measure", BORROWED, 0.0, None),
                     id="cold-its-free-and-paid-measures-failed-it-borrows"),
        pytest.param("unmeasured", 2, (freed("a", NOW - 1), owing(0.0, 1.5), lent("a")),
                     ("b a c", None, "", "", 0.0, "a"), id="cold-it-borrows-once"),
        pytest.param("unmeasured", 2, (freed("a", NOW - 1), owing(0.0, 4.5)),
                     ("b a c", None, "", "", 0.0, "a"), id="cold-it-borrows-within-the-cap-owed"),
        pytest.param("unmeasured", 2, (in_flight("a"), tokens(0.9)), ("a b c", "a", "measure", PAID, 0.0, None),
                     id="a-cold-burst-measure-may-spend-the-hedges-token"),
        pytest.param("unmeasured", 2, (in_flight("a"), tokens(0.5)), ("a b c", None, "", "", 0.0, "b"),
                     id="being-measured-already-it-leads-unraced"),
        pytest.param("explore", 2, (tokens(1.95),), ("a b c", "a", "explore", PAID, RESERVE, None),
                     id="an-explore-pays-leaving-the-reserve"),
        pytest.param("explore", 2, (tokens(1.5),), ("b a c", None, "", "", 0.0, "a"),
                     id="an-explore-never-takes-the-hedges-reserve"),
        pytest.param("explore", 2, (tokens(1.9),), ("a b c", "a", "explore", PAID, RESERVE, None),
                     id="this-requests-own-deposit-counts"),
    ],
)
def test_the_plan_decides_who_races_and_who_pays(first: str, together: int, setups: tuple[Any, ...],
                                                 race: tuple[str, str | None, str, str, float, str | None]) -> None:
    state = State()
    for setup in setups:
        setup(state)
    route = ABC.routes["chat"]
    assert route.hedge is not None
    got = opening(route.hedge, "chat", route.targets, first, together, state, NOW, STREAMED)
    learner = None if got.learner is None else got.learner.name
    assert (" ".join(t.name for t in got.order), learner, got.role, got.pays, got.keep, got.refused) == race


@pytest.mark.parametrize(
    ("hedge", "setups", "delays"),
    [
        pytest.param({"after": 1}, (), {"a": 1.0, "b": 1.0, "c": 1.0}, id="a-fixed-after-for-every-leader"),
        pytest.param({"after": "p50"}, (fig("b", 0.1, 0.2, 0.3, 0.4, 0.5),), {"a": None, "b": 0.3, "c": None},
                     id="a-percentile-from-each-leaders-own-samples"),
    ],
)
def test_the_plan_gives_each_leader_its_hedge_delay(hedge: dict[str, Any], setups: tuple[Any, ...],
                                                    delays: dict[str, float | None]) -> None:
    state = State()
    for setup in setups:
        setup(state)
    cfg = config("ordered", [t("a"), t("b"), t("c")], hedge=hedge)
    planned = plan(cfg, Ask("t1", "chat"), state, NOW, random.Random(7))
    assert planned.opening is not None and dict(planned.opening.hedge_after) == delays


def test_a_pin_has_no_race_to_plan() -> None:
    planned = plan(ABC, Ask("t1", "chat", pin="b"), State(), NOW, random.Random(7))
    assert planned.opening is None


# -- a leader past its hedge delay, unraced, is evidence (docs/adr/0023, "An overdue leader") -------------------------


def overdue_at(after: float, elapsed: float, hedge: str = "b", cold: bool = False) -> Any:
    """A call of ``a`` begun ``after`` seconds past NOW is still without a token ``elapsed`` later, at its hedge
    delay, and the budget refused the hedge to ``hedge`` (walk/race.py tells ``overdue``); ``cold``: refused
    for the cold start's advances, the route having earned no token yet."""
    def setup(s: State) -> None:
        from proxy.walk.evidence import overdue  # the race's door to the state
        route = STEADY.routes["chat"]
        leader, target = (next(x for x in route.targets if x.name == n) for n in ("a", hedge))
        budget = s.budget("chat", 0.1)
        budget.tokens, budget.owed, budget.earned = (0.0, 3.0, False) if cold else (0.0, 0.0, True)  # or spent
        overdue(s, route.fastest, True, leader, NOW + after, NOW + after + elapsed, target, budget)

    return setup


def answered(name: str, secs: float, after: float) -> Any:
    def setup(s: State) -> None:
        s.tracker.record((name, "m"), secs, NOW + after + secs)

    return setup


STEADY = config("fastest", [t("a"), t("b"), t("c")], fastest={"explore": 0},
                hedge={"after": "p90", "max_extra": 0.1, "refresh": 30})
WARM = (fig("a", *[0.04] * 10), fig("b", *[0.1] * 10), fig("c", *[0.4] * 10))


@pytest.mark.parametrize(
    ("setups", "first"),
    [
        pytest.param((), "a", id="a-leads-on-its-figure"),
        pytest.param((overdue_at(0.0, 0.05),), "a", id="one-call-past-its-p90-is-held-not-averaged"),
        pytest.param((overdue_at(0.0, 0.05), overdue_at(0.01, 0.05)), "b",
                     id="two-in-a-row-demote-it-behind-the-hedges-target-while-they-still-run"),
        pytest.param((overdue_at(0.0, 0.05), answered("a", 0.04, 0.02), overdue_at(0.1, 0.05)), "a",
                     id="a-faster-answer-between-clears-it-a-stall-one-call-in-ten"),
        pytest.param((overdue_at(0.0, 0.05), answered("a", 0.3, 0.02), overdue_at(0.4, 0.08)), "b",
                     id="a-slower-answer-between-confirms-it"),
        pytest.param((overdue_at(0.0, 0.03), overdue_at(0.01, 0.03)), "a",
                     id="not-past-its-own-figure-says-nothing"),
        pytest.param((overdue_at(0.0, 0.05, cold=True), overdue_at(0.01, 0.05, cold=True)), "a",
                     id="in-the-cold-start-a-refusal-is-the-advances-and-says-nothing"),
        pytest.param((fig("b"), overdue_at(0.0, 0.05, "c"), overdue_at(0.01, 0.05, "c")), "b",
                     id="demoted-behind-the-target-the-hedge-would-have-started"),
    ],
)
def test_a_leader_overdue_with_its_hedge_refused_is_a_lower_bound(setups: tuple[Any, ...], first: str) -> None:
    state = State()
    for setup in (*WARM, *setups):
        setup(state)
    planned = plan(STEADY, Ask("t1", "chat"), state, NOW + 1.0, random.Random(7))
    assert planned.targets[0].name == first, planned.decision.header()


def test_an_overdue_leader_is_not_held_behind_an_unmeasured_hedge() -> None:
    """Nothing to rank it behind: the unmeasured target is owed a measure of its own."""
    from proxy.walk.evidence import overdue

    state = State()
    fig("a", *[0.04] * 10)(state)
    route = STEADY.routes["chat"]
    a, b = route.targets[0], route.targets[1]
    budget = state.budget("chat", 0.1)
    budget.tokens, budget.owed, budget.earned = 0.0, 0.0, True
    for i in range(3):
        assert not overdue(state, route.fastest, True, a, NOW + i, NOW + i + 0.05, b, budget)
    assert state.tracker.held(a.key) == 0


@pytest.mark.parametrize(
    ("owed", "borrows", "granted"),
    [
        pytest.param(0.0, 3, [True, True, True], id="a-warm-route-borrows"),
        pytest.param(0.0, 7, [True] * 5 + [False] * 2, id="at-most-cap-owed"),
        pytest.param(4.5, 2, [False, False], id="a-cold-route-owing-its-advances-borrows-less"),
        pytest.param(3.5, 3, [True, False, False], id="up-to-the-cap-with-what-it-owes"),
    ],
)
def test_a_re_race_borrows_a_token_the_next_deposits_repay(owed: float, borrows: int, granted: list[bool]) -> None:
    budget = HedgeBudget(0.1)
    budget.tokens, budget.owed = 0.0, owed
    assert [budget.borrow() for _ in range(borrows)] == granted
    lent = sum(granted)
    for _ in range(round((owed + lent) * 10) - 1):
        budget.deposit()
    assert budget.tokens == pytest.approx(0.0) and budget.owed > 0  # repaid first: the bucket has not grown
    budget.deposit()
    budget.deposit()
    assert budget.owed == 0.0 and budget.tokens == pytest.approx(0.1)
    assert CAP == 5.0
